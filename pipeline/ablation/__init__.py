"""Data ablations that can tell: arms trained on matched mixtures, scored in bits per byte on references held out
before ingest, with paired differences, bootstrap intervals, an A/A noise floor and a positive control."""
