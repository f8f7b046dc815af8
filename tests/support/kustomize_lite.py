"""The part of kustomize that deploy/kubernetes uses, to render it where no kustomize binary is
(where kubectl is, tests/test_deploy_kubernetes.py checks both render the same):
`resources`, `namespace`, `images`, `configMapGenerator` (files; create or replace, without a
hash suffix) and JSON 6902 `patches` with a kind/name target. Any other field fails, so an
overlay that needs more fails its test instead of rendering differently from kustomize."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN = {"apiVersion", "kind", "resources", "namespace", "images", "configMapGenerator", "generatorOptions",
         "patches"}
#: Kinds kustomize leaves without a namespace (of those deploy/kubernetes could hold).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "StorageClass", "PriorityClass"}
Doc = dict[str, Any]


class KustomizeError(Exception):
    """A kustomization this renderer does not support, or one kustomize would reject."""


def render(directory: Path) -> list[Doc]:
    """The resources `kubectl kustomize directory` prints, as dicts."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - KNOWN
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    if k.get("generatorOptions", {}) != {"disableNameSuffixHash": True} and "generatorOptions" in k:
        raise KustomizeError(f"{directory}: only generatorOptions.disableNameSuffixHash: true is supported")
    docs: list[Doc] = []
    for res in k.get("resources", []):
        path = directory / res
        docs += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for gen in k.get("configMapGenerator", []):
        _generate(directory, gen, docs, hashed="generatorOptions" not in k)
    for patch in k.get("patches", []):
        _patch(directory, patch, docs)
    for doc in docs:
        if "namespace" in k and doc["kind"] not in CLUSTER_SCOPED:
            doc.setdefault("metadata", {})["namespace"] = k["namespace"]
        _set_images(doc, k.get("images", []))
    return docs


def _generate(directory: Path, gen: Doc, docs: list[Doc], *, hashed: bool) -> None:
    if hashed:
        raise KustomizeError(f"{directory}: a hashed ConfigMap name is not supported (disableNameSuffixHash)")
    if set(gen) - {"name", "files", "behavior"}:
        raise KustomizeError(f"{directory}: unsupported configMapGenerator fields in {gen}")
    data = {Path(f).name: (directory / f).read_text() for f in gen["files"]}
    doc: Doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data}
    existing = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == gen["name"]]
    behavior = gen.get("behavior", "create")
    if behavior == "create" and not existing:
        docs.append(doc)
    elif behavior == "replace" and existing:
        existing[0]["data"] = data
    else:
        raise KustomizeError(f"{directory}: configMapGenerator {gen['name']}: behavior {behavior} "
                             f"with {len(existing)} existing")


def _patch(directory: Path, patch: Doc, docs: list[Doc]) -> None:
    target = patch["target"]
    if set(patch) != {"path", "target"} or set(target) - {"kind", "name"}:
        raise KustomizeError(f"{directory}: only JSON 6902 patches by path with a kind/name target: {patch}")
    ops = yaml.safe_load((directory / patch["path"]).read_text())
    matched = [d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]]
    if not matched or not isinstance(ops, list):
        raise KustomizeError(f"{directory}: patch {patch['path']} matches no resource or is no JSON 6902 list")
    for doc in matched:
        for op in ops:
            _apply(doc, op)


def _apply(doc: Doc, op: Doc) -> None:
    """One RFC 6902 operation (add, replace, remove, test) on `doc`, in place."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key: Any = last if isinstance(node, dict) else (len(node) if last == "-" else int(last))
    kind = op["op"]
    if kind == "test":
        if node[key] != op["value"]:
            raise KustomizeError(f"test failed at {op['path']}: {node[key]!r} != {op['value']!r}")
    elif kind == "remove":
        del node[key]
    elif kind == "replace":
        if isinstance(node, dict) and key not in node:
            raise KustomizeError(f"replace of missing {op['path']}")
        node[key] = copy.deepcopy(op["value"])
    elif kind == "add" and isinstance(node, list):
        node.insert(key, copy.deepcopy(op["value"]))
    elif kind == "add":
        node[key] = copy.deepcopy(op["value"])
    else:
        raise KustomizeError(f"unsupported patch op {kind}")


def _set_images(doc: Doc, images: list[Doc]) -> None:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        ref = container["image"].split("@")[0]
        name = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
        for image in images:
            if image["name"] == name:
                new = image.get("newName", name)
                container["image"] = f"{new}:{image['newTag']}" if "newTag" in image else new
