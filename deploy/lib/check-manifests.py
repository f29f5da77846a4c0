#!/usr/bin/env python3
"""Checks Kubernetes manifests against the API's own OpenAPI v3 schemas, offline.

Every document must name an apiVersion/kind the schemas know, and must match its schema with
unknown fields refused (the API server's strict field validation), required fields present,
and enums and types respected. Semantic rules the API server adds on top (CEL, immutability,
cross-field checks) are not covered: `kubectl apply --dry-run=server` against a cluster is.

usage: check-manifests.py --openapi DIR FILE...   (FILE may be `-` for stdin)
DIR holds the `*_openapi.json` files of k8s.io/kubernetes's api/openapi-spec/v3.
"""

import argparse
import glob
import json
import os
import sys

try:
    import jsonschema
    import yaml
except ImportError as missing:
    sys.exit(f"check-manifests: {missing}; install with `python3 -m pip install pyyaml jsonschema`")


def load_schemas(openapi_dir):
    """Returns (definitions, {(apiVersion, kind): definition name}) from every spec file in DIR."""
    definitions, by_gvk = {}, {}
    files = sorted(glob.glob(os.path.join(openapi_dir, "*_openapi.json")))
    if not files:
        sys.exit(f"check-manifests: no *_openapi.json files in {openapi_dir}")
    for path in files:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        for name, schema in spec.get("components", {}).get("schemas", {}).items():
            definitions.setdefault(name, schema)
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                group, version = gvk.get("group", ""), gvk["version"]
                api_version = f"{group}/{version}" if group else version
                by_gvk.setdefault((api_version, gvk["kind"]), name)
    return {name: strict(schema) for name, schema in definitions.items()}, by_gvk


def strict(schema):
    """Rewrites OpenAPI refs to JSON-schema definitions and refuses unknown object fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if isinstance(out.get("$ref"), str):
        out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/definitions/")
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def describe(doc):
    meta = doc.get("metadata") or {}
    where = "/".join(part for part in (meta.get("namespace"), meta.get("name")) if part)
    return f"{doc.get('kind', '?')} {where or '(unnamed)'}"


def check_document(doc, definitions, by_gvk):
    """Yields the problems of one document as strings."""
    if not isinstance(doc, dict):
        yield "is not a mapping"
        return
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not api_version or not kind:
        yield "lacks apiVersion or kind"
        return
    name = by_gvk.get((api_version, kind))
    if name is None:
        yield f"{api_version} {kind} is not a type this Kubernetes version serves"
        return
    schema = {"$ref": f"#/definitions/{name}", "definitions": definitions}
    validator = jsonschema.Draft7Validator(schema)
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "(document)"
        yield f"{path}: {error.message}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--openapi", required=True, help="directory of *_openapi.json files")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    definitions, by_gvk = load_schemas(args.openapi)

    problems = checked = 0
    for path in args.files:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as err:
            print(f"{path}: not valid YAML: {err}")
            problems += 1
            continue
        for doc in docs:
            checked += 1
            for problem in check_document(doc, definitions, by_gvk):
                print(f"{path}: {describe(doc) if isinstance(doc, dict) else 'document'}: {problem}")
                problems += 1
    if problems:
        print(f"check-manifests: {problems} problem(s) in {checked} document(s)")
        return 1
    print(f"check-manifests: {checked} document(s) match the API schemas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
