"""#51: the last-word cloze that replaces the continuation task: items at line ends, distractors from the same
domain with as many letters, in the same position, the same for every checkpoint."""

from __future__ import annotations


class Chars:
    """A stand-in tokenizer: one id per character (a word of n letters is n tokens)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_last_words_are_line_ends_of_prose():
    from pipeline.ablation.score import last_words

    text = ("A first line that has enough words to count here.\nshort line end\n"
            "The quick brown fox jumps over the lazy dog.\nSix words but a number 42\n")
    assert last_words(text, 4) == [
        ("A first line that has enough words to count here.\nshort line end\nThe quick brown fox jumps over the lazy",
         "dog"),
        ("A first line that has enough words to count", "here")]
    assert last_words(text, 1) == last_words(text, 4)[:1] and last_words(text, 0) == []


def test_cloze_distractors_match_the_word_in_letters_and_position():
    from pipeline.ablation.score import cloze_items

    words = ["cat", "dog", "sun", "hat", "tree", "lamp"]
    refs = [{"id": f"r{i}", "domain": "prose", "text": f"one two three four five {w}.\n"} for i, w in enumerate(words)]
    refs.append({"id": "c0", "domain": "code", "text": "x y z w v cat\n"})
    items = cloze_items(refs, Chars(), eos=2, seq_len=64, per_doc=4)
    assert [it["doc"] for it in items] == ["r0", "r1", "r2", "r3"]       # 4-letter words and code: < 3 distractors
    for it in items:
        true, *others = it["rows"]
        ctx = [2] + Chars().encode("one two three four five")
        assert all(r[:len(ctx)] == ctx and len(r) == len(true) for r in it["rows"])
        word = "".join(chr(c) for c in true[len(ctx):])
        assert word == words[int(it["doc"][1:])]
        assert sorted("".join(chr(c) for c in r[len(ctx):]) for r in others) == sorted(
            set(["cat", "dog", "sun", "hat"]) - {word})
    assert cloze_items(refs, Chars(), eos=2, seq_len=64, per_doc=4) == items        # same items every time
    assert all(len(r) <= 9 for it in cloze_items(refs, Chars(), eos=2, seq_len=8, per_doc=4) for r in it["rows"])
