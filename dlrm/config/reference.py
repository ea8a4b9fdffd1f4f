"""The configuration reference, ``docs/configuration.md``, generated from the schema (the docstring beside each
field) and the shipped config groups in ``conf/``; a test fails when the file is out of date::

    python -m dlrm.config --markdown docs/configuration.md   # regenerate it
    python -m dlrm.config --markdown -                        # print it
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from dlrm.config.compose import CONF_DIR, GROUPS, compose, group_options, section_schema
from dlrm.config.schema import Config
from dlrm.config.sharding import ShardingConfig, TableConstraintConfig


def field_docs(schema: type) -> Dict[str, str]:
    """The docstring beside each field of a schema class (the string literal after its annotation), as one
    line per field; fields without one (the nested sections) are absent."""
    tree = ast.parse(inspect.getsource(schema).strip() + "\n")
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: Dict[str, str] = {}
    for a, b in zip(body, body[1:]):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            out[a.target.id] = " ".join(b.value.value.split())
    return out


def sections() -> List[tuple]:
    """``(key prefix, schema class)`` for every section of :class:`Config`, in document order."""
    out: List[tuple] = [("", Config)]

    def walk(prefix: str, schema: type) -> None:
        for f in dataclasses.fields(schema):
            sub = section_schema(f)
            if sub is not None:
                out.append((f"{prefix}{f.name}.", sub))
                walk(f"{prefix}{f.name}.", sub)
                if sub is ShardingConfig:
                    out.append((f"{prefix}{f.name}.constraints.<table>.", TableConstraintConfig))

    walk("", Config)
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        items = [_fmt(v) for v in value]
        shown = items if len(items) <= 6 else items[:4] + [f"... ({len(items)} values)"]
        return "[" + ", ".join(shown) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{...}"
    return str(value)


def _md(text: str) -> str:
    """reST literals (double backquotes) as Markdown code; pipes escaped for a table cell."""
    return text.replace("``", "`").replace("|", "\\|")


def _flat(node: Any, prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, dict) and v and k != "constraints":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _composed(overrides: Sequence[str]) -> Dict[str, Any]:
    node = OmegaConf.to_container(compose(overrides), resolve=False)
    assert isinstance(node, dict)
    node.pop("hydra", None)
    return _flat(node)


_GROUP_DEFAULT = {
    "model": "dlrm_v2_small",
    "data": "synthetic",
    "optimizer": "adagrad",
    "sharding": "auto",
    "pipeline": "sparse_dist",
    "offload": "none",
    "perf": "fp32",
    "logger": "[stdout, jsonl]",
    "experiment": "none",
}


def _yaml_comment(group: str, option: str) -> str:
    """The first comment paragraph of a group file, as one line."""
    words: List[str] = []
    with open(os.path.join(CONF_DIR, group, f"{option}.yaml"), encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if not s.startswith("#") or s.startswith("# @package"):
                if words or not s.startswith("# @package"):
                    break
                continue
            text = s.lstrip("#").strip()
            if not text:
                break
            words.append(text)
    return " ".join(words)


def configuration_markdown() -> str:
    """``docs/configuration.md``: every config key with its default (what ``python train.py`` composes), the
    values the shipped group options give it, and its docstring from this module."""
    default = _composed([])
    by_option: Dict[str, List[str]] = {}
    for group in GROUPS:
        if group == "experiment":
            continue
        for option in group_options(group):
            base = ["logger=[]"] if group == "logger" else []
            ref = _composed(base) if base else default
            over = _composed([f"logger=[{option}]"] if group == "logger" else [f"{group}={option}"])
            for key, value in over.items():
                if key.startswith(f"{group}.") and value != ref.get(key):
                    by_option.setdefault(key, []).append(
                        f"`{group}={option}`: `{_fmt(value)}`"
                        if group != "logger"
                        else f"`logger=[{option}]`: `{_fmt(value)}`"
                    )
    lines = [
        "# Configuration reference",
        "",
        "Every key of the trainer's config, with its default (what `python train.py` composes) and the values the",
        "shipped config groups give it. Generated from the schema in `dlrm/config/` (the docstring beside each",
        "field) and the files in `conf/` by `python -m dlrm.config --markdown docs/configuration.md`; a test fails",
        "when this file is out of date. Set any key on the command line (`data.batch_size=1024`), pick a group",
        "option (`perf=fast`), add a per-table constraint with `+` (`+sharding.constraints.t_cat_0.sharding_types=",
        "[row_wise]`), and print the composed config with `python train.py --cfg job`. Hydra's own keys",
        "(`hydra.run.dir`, the run directory) are Hydra's.",
        "",
        "## Config groups",
        "",
        "| option | what it is |",
        "| --- | --- |",
    ]
    for group in GROUPS:
        d = _GROUP_DEFAULT[group]
        for o in group_options(group):
            default_mark = " (default)" if o == d or o in d.strip("[]").split(", ") else ""
            option = f"`logger=[{o}]`" if group == "logger" else f"`{group}={o}`"
            lines.append(f"| {option}{default_mark} | {_md(_yaml_comment(group, o))} |")
    for prefix, schema in sections():
        docs = field_docs(schema)
        title = prefix.rstrip(".") or "top level"
        lines += [
            "",
            f"## `{title}`" if prefix else "## Top-level keys",
            "",
            _md(" ".join((inspect.getdoc(schema) or "").split())),
            "",
            "| key | default | set by | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for f in dataclasses.fields(schema):
            if f.name not in docs:
                continue
            key = f"{prefix}{f.name}"
            value = default.get(key) if "<table>" not in prefix else None
            setby = "; ".join(by_option.get(key, []))
            lines.append(f"| `{key}` | `{_fmt(value)}` | {setby} | {_md(docs[f.name])} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m dlrm.config", description="The trainer's configuration reference.")
    p.add_argument(
        "--markdown",
        metavar="PATH",
        required=True,
        help="write the configuration reference (docs/configuration.md) to PATH; - for stdout",
    )
    args = p.parse_args(argv)
    text = configuration_markdown()
    if args.markdown == "-":
        print(text, end="")
    else:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
