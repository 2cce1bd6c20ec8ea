"""What a run produced, for people: the HTML run report (``html``), its SVG charts (``svgplot``) and the
``mindloom summary`` text (``summary``)."""
