#!/usr/bin/env python3
"""Exits 0 when two YAML streams hold the same objects (comments, layout and empty documents
aside), else prints the first difference and exits 1.

usage: same-objects.py EXPECTED ACTUAL
"""
import sys

import yaml


def objects(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    expected, actual = objects(sys.argv[1]), objects(sys.argv[2])
    if len(expected) != len(actual):
        print(f"{len(expected)} objects in {sys.argv[1]}, {len(actual)} in the other")
        return 1
    for index, (a, b) in enumerate(zip(expected, actual)):
        if a != b:
            name = (a.get("metadata") or {}).get("name")
            print(f"object {index} ({name}) differs:\n  {a}\n  {b}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
