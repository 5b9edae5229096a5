"""Parameter overrides: the one place that checks, parses and applies ``key=value`` changes.

Three users share it. ``python -m orchestration.overrides params-paper-gpu.yaml`` turns a
partial params file (a preset: only the keys it changes) into ``dvc exp run -S`` arguments,
so ``dvc exp run $(python -m orchestration.overrides FILE)`` (``scripts/exp_preset.sh FILE``)
runs that set as a DVC experiment while ``params.yaml`` keeps the defaults. On a machine
without DVC, ``--write OUT FILE -S key=value`` writes the params file such a run would see
(:func:`write_params`, used by ``scripts/run_preset.sh``). The Prefect flow
(``orchestration.flows``) checks its overrides with :func:`resolve` and writes them with
:func:`apply`.

Values given as text are read with Hydra's override grammar, the grammar of
``dvc exp run -S`` (``5`` is a number, ``'5'`` a string, ``[1, 2]`` a list, ``2e-4`` a
float), so a key set through the flow means what it means on DVC's command line.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import merged
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_path, check_writable


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _walk(params: Any, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of dotted ``key`` in ``params``; a digit part indexes a list."""
    node = params
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def check_key(params: Any, key: Any, source: str = "params.yaml") -> Any:
    """Return the current value of dotted ``key``; raise if ``params`` has no such key.

    Raises:
        PipelineError: naming the key and the sections ``source`` does have.
    """
    found, value = _walk(params, key) if isinstance(key, str) and key else (False, None)
    if not found:
        sections = ", ".join(sorted(params)) if isinstance(params, dict) and params else "(none)"
        raise PipelineError(
            f"{key} is not a key of {source}; use section.key with one of the sections: "
            f"{sections}"
        )
    return value


def parse_value(key: str, text: str) -> Any:
    """Read ``text`` as ``dvc exp run -S key=text`` would (Hydra's override grammar).

    Raises:
        PipelineError: when the text is not a valid override value.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        (override,) = OverridesParser.create().parse_overrides([f"{key}={text}"])
    except HydraException as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PipelineError(
            f"cannot read the value of {key}={text} ({reason}); write it as on "
            "`dvc exp run -S`: 5, 0.1, true, [1, 2], or quote a string: 'text'"
        ) from exc
    if override.is_sweep_override():
        raise PipelineError(f"{key}={text} is a sweep; give one value per run")
    return override.value()


def resolve(
    params_path: Path, overrides: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check ``overrides`` against ``params_path``; return (new values, current values).

    A string value is parsed like on DVC's command line; other values are taken as
    they are (a deployment parameter ``{"train.steps": 5}`` is already a number).

    Raises:
        PipelineError: the file is missing, a key is unknown or a value unreadable.
    """
    if not overrides:
        return {}, {}
    if not params_path.is_file():
        raise PipelineError(
            f"overrides given but {params_path} does not exist; add it or drop the overrides"
        )
    params = yaml.safe_load(params_path.read_text()) or {}
    new, old = {}, {}
    for key, value in overrides.items():
        old[key] = check_key(params, key, params_path.name)
        new[key] = parse_value(key, value) if isinstance(value, str) else value
    check_sections(params, new, params_path.parent)
    return new, old


def check_sections(params: dict[str, Any], new: dict[str, Any], root: Path) -> None:
    """Check ``params`` with ``new`` applied as every stage will read it, before any stage.

    See :func:`orchestration.checks.check_params`: every section a known schema reads, then
    the checks that span sections (a section of another project's file is left to its stage).

    Raises:
        PipelineError: an override that a stage would refuse (``train.steps=abc``).
    """
    from orchestration.checks import check_params

    after = copy.deepcopy(params)
    for key, value in new.items():
        _set(after, key, value)
    check_params(params, after, {k: f"-S {d}" for k, d in zip(new, describe(new), strict=True)},
                 root)


def _set(tree: Any, key: str, value: Any) -> None:
    """Set dotted ``key`` (which exists) in a parsed params tree; a digit part indexes a list."""
    *parents, last = key.split(".")
    node = tree
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value


def describe(values: dict[str, Any]) -> list[str]:
    """``key=value`` strings for logs and reports (values as JSON)."""
    return [f"{key}={json.dumps(value, default=str)}" for key, value in values.items()]


def apply(params_path: Path, values: dict[str, Any]) -> tuple[str, str]:
    """Set dotted keys in ``params_path`` in place, keeping its comments and layout.

    The keys must exist (check them with :func:`resolve` first). The file is
    rewritten atomically, so a crash leaves the old or the new file, never half.

    Returns:
        The file's text before and after, for :func:`restore`.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.util import load_yaml_guess_indent

    before = params_path.read_text()
    rt = YAML()  # round-trip mode: comments, key order and quoting survive
    rt.preserve_quotes = True
    # The file's own indentation, and no line wrapping: only the set lines change.
    _, indent, offset = load_yaml_guess_indent(before)
    nested = [len(m.group(1)) for m in re.finditer(r"^( +)[^\s#-][^:\n]*:", before, re.M)]
    rt.indent(mapping=min(nested, default=2), sequence=indent, offset=offset)
    rt.width = 1 << 16
    data = rt.load(before)
    for key, value in values.items():
        _set(data, key, value)
    with atomic_path(params_path) as tmp, tmp.open("w") as fh:
        rt.dump(data, fh)
    return before, params_path.read_text()


def restore(params_path: Path, texts: tuple[str, str], old: dict[str, Any]) -> None:
    """Undo :func:`apply`: its ``(before, after)`` texts, and the values it replaced.

    While the file still holds what ``apply`` wrote, the text before comes back byte for
    byte; if it was edited since, only the keys are set back, keeping those edits.
    """
    before, after = texts
    if params_path.read_text() != after:
        apply(params_path, old)
        return
    with atomic_path(params_path) as tmp:
        tmp.write_text(before)


def overrides(profile: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """``-S`` arguments for every leaf of ``profile``; each key must exist in ``base``."""
    args = []
    for key, value in flatten(profile).items():
        check_key(base, key)
        text = json.dumps(value, separators=(",", ":"))
        if any(ch.isspace() for ch in text):
            # The output is meant for $(...), which splits on whitespace.
            raise PipelineError(f"{key} has whitespace in its value; pass it with -S by hand")
        args += ["-S", f"{key}={text}"]
    return args


def _load(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise PipelineError(f"{path} not found; give {what}")
    tree = yaml.safe_load(path.read_text()) or {}
    if not isinstance(tree, dict):
        raise PipelineError(f"{path} is not a mapping of params.yaml sections; give {what}")
    return tree


def write_params(out: Path | None, base: Path, profiles: list[Path], sets: list[str]) -> None:
    """Write ``base`` with presets, then ``key=value`` sets, laid over it, to ``out``.

    The params a ``dvc exp run`` of the same presets and ``-S`` sets would see, for a
    machine without DVC. Every key must exist in ``base``; values are read as ``-S`` reads
    them, and the result is checked as the stages will read it before anything is written
    (``out`` None: check only). ``out`` may be ``base`` itself; it is replaced atomically.

    Raises:
        PipelineError: a missing file, an unknown key, a set without ``=``, a bad value, a
            value a stage would refuse.
    """
    if out is not None:
        check_writable(out, "--write")  # /proc/x.yaml, a read-only folder: one line, now
    original = _load(base, "a params file")
    params = copy.deepcopy(original)
    changed: dict[str, str] = {}
    for profile in profiles:
        part = _load(profile, "a partial params YAML file")
        for key, value in flatten(part).items():
            check_key(params, key, base.name)
            changed[key] = f"{profile.name}: {key}={json.dumps(value, default=str)}"
        params = merged(params, part)
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep:
            raise PipelineError(f"-S {item}: write it as key=value")
        check_key(params, key, base.name)
        _set(params, key, parse_value(key, text))
        changed[key] = f"-S {item}"
    if changed:
        from orchestration.checks import check_params

        # Stages given the file run from here (scripts/run_preset.sh), so paths resolve here.
        check_params(original, params, changed, Path.cwd())
    if out is None:
        return
    with atomic_path(out) as tmp:
        tmp.write_text(yaml.safe_dump(params, sort_keys=False))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", type=Path, nargs="*", metavar="preset",
                        help="partial params file (params-paper-gpu.yaml)")
    parser.add_argument("--params", type=Path, default=None, help="default: params.yaml")
    parser.add_argument("--write", type=Path, metavar="OUT",
                        help="write --params with the presets and -S sets to OUT instead")
    parser.add_argument("-S", "--set-param", dest="sets", action="append", default=[],
                        metavar="KEY=VALUE", help="with --write: set a key, as dvc exp run -S")
    parser.add_argument("--check", action="store_true",
                        help="only check the presets and -S sets as the stages will read them "
                             "(exit 0, or one error line and exit 2); write nothing")
    args = parser.parse_args(argv)
    params_given, args.params = args.params is not None, args.params or Path("params.yaml")
    if args.check or args.write:
        if args.check and args.write:
            raise PipelineError("give --check or --write OUT, not both")
        if (args.write and not params_given and args.write.exists()
                and args.write.resolve() == args.params.resolve()):
            # A plain dump would drop params.yaml's comments and layout; in place is meant
            # for copies (scripts/run_preset.sh names --params for those).
            raise PipelineError(f"--write {args.write} would overwrite the params file it reads; "
                                "write to another file, or name it with --params too to "
                                "rewrite it in place")
        write_params(args.write, args.params, args.profiles, args.sets)
        return
    if len(args.profiles) != 1 or args.sets:
        raise PipelineError("give one preset file to print its -S arguments (-S goes with "
                            "--write or --check, or straight to dvc exp run)")
    # Checked as the stages will read it, so `dvc exp run` refuses nothing after upstream work.
    write_params(None, args.params, args.profiles, [])
    profile = _load(args.profiles[0], "a partial params YAML file")
    print(" ".join(overrides(profile, _load(args.params, "a params file"))))


if __name__ == "__main__":
    run_cli(main)
