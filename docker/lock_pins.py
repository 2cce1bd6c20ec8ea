"""Print ``name==version`` from requirements.lock for every distribution named in a package list.

Used by the Dockerfiles so images install mindloom's dependencies at exactly the versions the tests ran with;
exits 1 naming the package when the lock has no pin for it (a list edited without re-locking).
"""

from __future__ import annotations

import re
import sys


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")]


def read_lock(path: str) -> dict[str, str]:
    pins = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
            if not m:
                raise SystemExit(f"{path}:{lineno}: not an exact 'name==version' pin: {line!r}")
            pins[norm(m.group(1))] = f"{m.group(1)}=={m.group(2)}"
    return pins


def pins_for(lock_path: str, names_path: str) -> list[str]:
    pins = read_lock(lock_path)
    missing = [n for n in read_names(names_path) if norm(n) not in pins]
    if missing:
        raise SystemExit(f"{names_path}: no pin in {lock_path} for: {', '.join(missing)}")
    return [pins[norm(n)] for n in read_names(names_path)]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: lock_pins.py requirements.lock package-list.txt")
    print("\n".join(pins_for(sys.argv[1], sys.argv[2])))
