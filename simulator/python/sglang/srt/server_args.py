"""Command line of the fake server: the real flag set, argparse, ``--config``.

* Flags: every command-line field of SGLang 0.5.23 (``flag_table.FIELDS``,
  generated from the wheel) plus the hand-registered ones of
  ``ServerArgs.add_cli_args`` (sglang.md §5).  The same table is used for
  every emulated version, with these version differences (§1.9, §5):
  ``--speculative-algorithm`` is an upper-case choice list before 0.5.23;
  ``--config`` exists from 0.5.10; ``--speculative-adaptive*`` only in
  0.5.23; the alias ``--speculative-draft-model`` only in 0.5.23; the parser's
  prog is ``sglang serve`` from 0.5.10 (older: ``launch_server.py``).
* Unknown flags are rejected by argparse itself (usage + "error:
  unrecognized arguments: ..." on stderr, exit 2).  Prefix abbreviations work
  as in the real parser (``allow_abbrev`` is left on, so ``--tp`` means
  ``--tp-size``).
* ``--config`` (0.5.10+): ``ConfigArgumentMerger`` semantics of
  ``utils/server_args_config_parser.py``, re-implemented on the YAML subset of
  ``yaml_subset.py``.  Only the exact token ``--config`` triggers the merge;
  ``--config=file.yaml`` is parsed and silently ignored (§5 pitfall).

This is the simulator's own implementation.  It must never import the
collection (``plugins/``, ``ansible_collections``): cross-checks between the
collection's resolver and this server would prove nothing otherwise.
"""
from __future__ import annotations

import argparse
import json
import logging
import os

from sglang.srt import flag_table, yaml_subset

logger = logging.getLogger("sglang.srt.server_args")

# Fields registered by hand in ServerArgs.add_cli_args (0.5.23
# server_args.py:351-445); they are not in the generated table.
MANUAL_FIELDS = (
    ("sampling_backend", ("--sampling-backend",), "str", None,
     ("flashinfer", "pytorch", "ascend", "intel_xpu")),
    ("reasoning_parser", ("--reasoning-parser",), "str", None, None),
    ("tool_call_parser", ("--tool-call-parser",), "str", None, None),
    ("kv_canary_real_data", ("--kv-canary-real-data",), "str", "none", ("none", "partial", "all")),
    ("disable_cuda_graph", ("--disable-cuda-graph",), "bool", False, None),
    ("enable_dp_attention", ("--enable-dp-attention",), "bool", False, None),
    ("enable_amd_monokernel", ("--monokernel-backend",), "monokernel", False, ("amd",)),
    ("enable_flashinfer_allreduce_fusion", ("--enable-flashinfer-allreduce-fusion",), "bool",
     False, None),
)

OLD_ALGORITHM_CHOICES = ("EAGLE", "EAGLE3", "NEXTN")          # 0.4.6 - 0.5.1
V0510_ALGORITHM_CHOICES = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
V0523_ONLY_FIELDS = ("speculative_adaptive", "speculative_adaptive_config")


def human_readable_int(value: str) -> int:
    """Same rules as sglang.srt.utils.common.human_readable_int."""
    import re

    value = value.strip()
    si = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}
    iec = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        number, suffix = m.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    "Decimals are not supported with IEC suffixes: %r" % value)
            return int(number) * iec[suffix]
        return int(float(number) * si[suffix])
    return int(value)


def _json_list(value: str):
    return json.loads(value)


def _nullable_str(value: str):
    if not value or value.lower() in ("none", "null"):
        return None
    return value


class _StoreConstTrue(argparse.Action):
    """``--monokernel-backend amd`` -> enable_amd_monokernel=True (deprecated alias)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)


_TYPES = {"str": str, "int": int, "float": float, "hrint": human_readable_int,
          "json": json.loads, "jsonlist": _json_list}


def all_fields(version_tuple) -> list:
    """(field, option strings, kind, default, choices) rows for a version."""
    rows = []
    for row in flag_table.FIELDS + MANUAL_FIELDS:
        name, names, kind, default, choices = row
        if name in V0523_ONLY_FIELDS and version_tuple < (0, 5, 23):
            continue
        if name == "speculative_draft_model_path" and version_tuple < (0, 5, 23):
            names = tuple(n for n in names if n != "--speculative-draft-model")
        if name == "speculative_algorithm" and version_tuple < (0, 5, 23):
            choices = V0510_ALGORITHM_CHOICES if version_tuple >= (0, 5, 10) else OLD_ALGORITHM_CHOICES
        rows.append((name, names, kind, default, choices))
    return rows


def field_defaults(version_tuple) -> dict:
    out = {}
    for name, _names, _kind, default, _choices in all_fields(version_tuple):
        out[name] = None if default == flag_table.REQUIRED else default
    return out


def build_parser(version_tuple) -> argparse.ArgumentParser:
    prog = "sglang serve" if version_tuple >= (0, 5, 10) else None
    parser = argparse.ArgumentParser(prog=prog)
    for name, names, kind, default, choices in all_fields(version_tuple):
        kwargs = {"dest": name}
        if default != flag_table.REQUIRED:
            kwargs["default"] = default
        else:
            kwargs["required"] = True
        if kind == "bool":
            kwargs["action"] = "store_true"
        elif kind == "boolopt":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind == "monokernel":
            kwargs.update(action=_StoreConstTrue, choices=list(choices))
        elif kind in ("strlist", "intlist", "floatlist"):
            kwargs["type"] = {"strlist": str, "intlist": int, "floatlist": float}[kind]
            kwargs["nargs"] = "*" if name in ("lora_paths", "lora_target_modules",
                                              "custom_weight_loader",
                                              "uvicorn_access_log_exclude_prefixes") else "+"
            if choices:
                kwargs["choices"] = list(choices)
        elif kind == "optstr":
            kwargs.update(type=str, nargs="?")
        else:
            kwargs["type"] = _TYPES[kind]
            if choices:
                kwargs["choices"] = list(choices)
        parser.add_argument(*names, **kwargs)
    if version_tuple >= (0, 5, 10):
        parser.add_argument(
            "--config", type=str,
            help="Read CLI options from a config file. Must be a YAML file with "
                 "configuration options.")
    return parser


# --------------------------------------------------------------------------
# --config merging (utils/server_args_config_parser.py, sglang.md §5)
# --------------------------------------------------------------------------
def _config_keys(action) -> set:
    return {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings
                            if o.startswith("--")}


def _takes_one_value(action) -> bool:
    return isinstance(action, argparse._StoreAction) or action.nargs is None


class ConfigArgumentMerger:
    """Inserts the YAML file's options before the remaining argv.

    Mirrors the real merger, including its key handling: the key is matched
    against flags with dashes or underscores to decide how a boolean is
    rendered, but the option is emitted as ``--<key as written>``.  A key
    written with underscores (``tp_size: 2``) therefore becomes ``--tp_size``,
    which argparse rejects as an unrecognized argument, exactly as SGLang
    0.5.10 / 0.5.23 do.
    """

    def __init__(self, parser):
        self.parser = parser
        self.store_true_actions = [key for a in parser._actions
                                   if isinstance(a, argparse._StoreTrueAction)
                                   for key in _config_keys(a)]
        supported = [a for a in parser._actions
                     if isinstance(a, argparse._StoreTrueAction) or _takes_one_value(a)]
        supported_keys = {k for a in supported for k in _config_keys(a)}
        self.unsupported_actions = {
            key: a for a in parser._actions
            if a.option_strings and a not in supported
            and "--config" not in a.option_strings
            and "--help" not in a.option_strings and "-h" not in a.option_strings
            for key in _config_keys(a) if key not in supported_keys}

    def merge_config_with_args(self, cli_args: list) -> list:
        config_file_path = self._extract_config_file_path(cli_args)
        if not config_file_path:
            return cli_args
        config_data = self._parse_yaml_config(config_file_path)
        config_args = self._convert_config_to_args(config_data)
        config_index = cli_args.index("--config")
        before_config = cli_args[:config_index]
        after_config = cli_args[config_index + 2:]
        return config_args + before_config + after_config

    @staticmethod
    def _extract_config_file_path(args: list):
        config_indices = [i for i, arg in enumerate(args) if arg == "--config"]
        if len(config_indices) > 1:
            raise ValueError("Multiple config files specified! Only one allowed.")
        if not config_indices:
            return None
        config_index = config_indices[0]
        if config_index == len(args) - 1:
            raise ValueError("No config file specified after --config flag!")
        return args[config_index + 1]

    def _parse_yaml_config(self, file_path: str) -> dict:
        self._validate_yaml_file(file_path)
        try:
            config_data = yaml_subset.load(file_path)
        except Exception as e:
            logger.error("Failed to read config file %s: %s", file_path, e)
            raise
        if config_data is None:
            config_data = {}
        if not isinstance(config_data, dict):
            raise ValueError("Config file must contain a dictionary at root level")
        return config_data

    @staticmethod
    def _validate_yaml_file(file_path: str) -> None:
        suffix = os.path.splitext(file_path)[1]
        if suffix.lower() not in (".yaml", ".yml"):
            raise ValueError(f"Config file must be YAML format, got: {suffix}")
        if not os.path.exists(file_path):
            raise ValueError(f"Config file not found: {file_path}")

    def _convert_config_to_args(self, config: dict) -> list:
        args = []
        for key, value in config.items():
            key = str(key)
            key_norm = key.replace("-", "_")
            if key_norm in self.unsupported_actions:
                action = self.unsupported_actions[key_norm]
                raise ValueError(f"Unsupported config option '{key_norm}' with action "
                                 f"'{action.__class__.__name__}'")
            if isinstance(value, bool):
                if key_norm in self.store_true_actions:
                    if value:
                        args.append(f"--{key}")
                else:
                    args.extend([f"--{key}", str(value).lower()])
            elif isinstance(value, list):
                if value:
                    args.append(f"--{key}")
                    args.extend(str(item) for item in value)
            elif isinstance(value, dict):
                args.extend([f"--{key}", json.dumps(value)])
            else:
                args.extend([f"--{key}", str(value)])
        return args


class ServerArgs:
    """The parsed record: attribute access over a dict of every field.

    ``raw`` keeps what the operator gave (after argparse defaults); resolution
    writes effective values into ``values`` (sglang.md §1.1: raw versus
    resolved values; ``/server_info`` reports resolved ones).
    """

    def __init__(self, values: dict, launch_argv: list, version: str, style: str):
        object.__setattr__(self, "values", dict(values))
        object.__setattr__(self, "raw", dict(values))
        object.__setattr__(self, "launch_argv", list(launch_argv))
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "_style", style)

    def __getattr__(self, name):
        values = object.__getattribute__(self, "values")
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        self.values[name] = value

    def resolve_once(self, ctx) -> None:
        """Run the resolution pipeline once (server_args.py:244-300, sglang.md §1.1)."""
        from sglang.srt.resolution import resolve

        resolve(self, ctx)

    def log(self) -> None:
        logger.info("server_args=%r", self)

    @property
    def launch_command(self) -> str:
        return " ".join(self.launch_argv)

    def resolved_dict(self) -> dict:
        return dict(self.values)

    def __repr__(self) -> str:
        # 0.5.23 logs the resolved dict (engine.py:173-174, 1185); older
        # releases log the dataclass repr.  Both include api_key
        # (sglang.md §2.1 "Secrets").
        hidden = ("watermark_key", "watermark_key_b", "watermark_config")
        if self._style == "dict":
            return repr({k: v for k, v in self.values.items() if k not in hidden})
        body = ", ".join(f"{k}={v!r}" for k, v in self.values.items() if k not in hidden)
        return f"ServerArgs({body})"


def prepare_server_args(argv: list, version: str, version_tuple,
                        configure_logging: bool = True) -> ServerArgs:
    """argv (without the program) -> ServerArgs; argparse exits 2 on errors."""
    parser = build_parser(version_tuple)
    if version_tuple >= (0, 5, 10) and "--config" in argv:
        argv = ConfigArgumentMerger(parser).merge_config_with_args(list(argv))
    ns = parser.parse_args(argv)
    # Basic logging before resolution, so its warnings carry the real format
    # "[%Y-%m-%d %H:%M:%S] message" (server_args.py prepare_server_args).
    from sglang.srt.utils import configure_logger

    if configure_logging:
        configure_logger(ns.log_level, log_ms=(os.environ.get("SGLANG_LOG_MS") or "").lower()
                         in ("1", "true"))
    values = {}
    for name, _n, _k, _d, _c in all_fields(version_tuple):
        if name not in values:
            values[name] = getattr(ns, name)
    style = "dict" if version_tuple >= (0, 5, 23) else "dataclass"
    return ServerArgs(values, argv, version, style)
