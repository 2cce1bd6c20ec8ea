"""Tokenizer stage: SentencePiece trained on a mixture-stratified sample (``run``), settings in ``config``.

Named ``tokenizer`` rather than ``tokenize`` so that it can never shadow the standard library's ``tokenize``.
"""
