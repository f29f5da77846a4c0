#!/usr/bin/env python3
"""Compares the RBAC rules of a chart render (stdin) with the reviewed list.

usage: helm template tessera deploy/helm/tessera --namespace tessera-system | check-rbac.py LIST

LIST (deploy/lib/rbac-reviewed.txt) has one line per granted verb:
`role | API group | resource | verb | file | text that file must contain`, the file being the
code that makes the call needing the verb. A rule narrowed to named objects lists its resource
as `resource(name,...)`, so dropping `resourceNames` from a rule shows as a change too. Fails (exit 1, one line per problem) when the render
grants a verb the list lacks, the list names a verb the render does not grant, or a named file
lacks its text (the call is gone, so the verb may be too). Paths are relative to the repository
root, the working directory.
"""

import sys

import yaml


def rendered(stream):
    rules = set()
    for doc in yaml.safe_load_all(stream):
        if not doc or doc.get("kind") not in ("Role", "ClusterRole"):
            continue
        role = f"{doc['kind']}/{doc['metadata']['name']}"
        for rule in doc.get("rules") or []:
            names = sorted(rule.get("resourceNames") or [])
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    if names:
                        resource = f"{resource}({','.join(names)})"
                    for verb in rule.get("verbs", []):
                        rules.add((role, group or "core", resource, verb))
    return rules


def reviewed(path):
    rules, problems = {}, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            fields = [field.strip() for field in line.split("|")]
            if len(fields) != 6 or not all(fields):
                problems.append(f"{path}:{number}: expected 6 fields separated by |: {line}")
                continue
            rules[tuple(fields[:4])] = (fields[4], fields[5], number)
    return rules, problems


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    granted = rendered(sys.stdin)
    listed, problems = reviewed(path)
    for rule in sorted(granted - listed.keys()):
        problems.append(
            "the chart grants {} verb `{}` on {} ({}), which {} does not list: "
            "name the call that needs it there, or remove the verb".format(rule[0], rule[3], rule[2], rule[1], path)
        )
    for rule in sorted(listed.keys() - granted):
        problems.append(
            "{}:{}: {} verb `{}` on {} is listed but the chart does not grant it".format(
                path, listed[rule][2], rule[0], rule[3], rule[2]
            )
        )
    for rule, (source, text, number) in sorted(listed.items()):
        try:
            with open(source, encoding="utf-8") as f:
                found = text in f.read()
        except OSError as error:
            problems.append(f"{path}:{number}: cannot read {source}: {error}")
            continue
        if not found:
            problems.append(
                f"{path}:{number}: {source} no longer contains `{text}`, the call that needs "
                f"{rule[0]} verb `{rule[3]}` on {rule[2]}: find the call that needs it, or remove the verb"
            )
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        sys.exit(1)
    print(f"RBAC: {len(granted)} rendered verbs, each listed in {path} with the call that needs it")


if __name__ == "__main__":
    main()
