"""Command line of the fake server: the real flag set, argparse, ``--config``.

* Flags: every command-line field of the emulated release, from the table
  generated out of the real parsers (``flag_table``, read from
  ``flag_table.json``): option strings, aliases, types, nargs, choices and
  defaults per release, so that argparse accepts and rejects exactly what that
  release does (``--speculative-algorithm`` is a choice list before 0.5.23,
  ``--config`` exists from 0.5.10, ``trtllm_mha`` is no attention backend in
  0.4.6, ...). The parser's prog is ``sglang serve`` from 0.5.10 (older:
  ``launch_server.py``).
* Unknown flags are rejected by argparse itself (usage + "error:
  unrecognized arguments: ..." on stderr, exit 2).  Prefix abbreviations work
  as in the real parser (``allow_abbrev`` is left on, so ``--tp`` means
  ``--tp-size``).
* ``--config`` (0.5.10+): ``ConfigArgumentMerger`` semantics of
  ``utils/server_args_config_parser.py``, re-implemented on the YAML subset of
  ``yaml_subset.py``.  Only the exact token ``--config`` triggers the merge;
  ``--config=file.yaml`` is parsed and silently ignored.
* The API the collection's oracle helper calls on a real SGLang: ``ServerArgs``
  with ``add_cli_args(parser)``, ``from_cli_args(namespace)``, ``resolve_once()``
  (0.5.23), ``check_server_args()`` and ``resolved_dict()``, and
  ``prepare_server_args(argv)``.

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
          "json": json.loads, "jsonlist": _json_list, "nullstr": _nullable_str}


def all_fields(version_tuple) -> list:
    """(field, option strings, kind, default, choices, nargs) rows for a version."""
    return flag_table.fields(version_tuple)


def field_names(version_tuple) -> list:
    names = []
    for row in all_fields(version_tuple):
        if row[0] not in names:
            names.append(row[0])
    return names


def field_defaults(version_tuple) -> dict:
    out = {}
    for name, _names, _kind, default, _choices, _nargs in all_fields(version_tuple):
        out.setdefault(name, None if default == flag_table.REQUIRED else default)
    return out


def add_cli_args(parser, version_tuple) -> None:
    """Register the release's flags on ``parser`` (ServerArgs.add_cli_args)."""
    for name, names, kind, default, choices, nargs in all_fields(version_tuple):
        kwargs = {"dest": name}
        if default != flag_table.REQUIRED:
            kwargs["default"] = default
        else:
            kwargs["required"] = True
        if kind == "bool":
            kwargs["action"] = "store_true"
        elif kind == "boolopt":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind == "constchoice":
            kwargs.update(action=_StoreConstTrue, choices=list(choices or ()))
        elif kind in ("strlist", "intlist", "floatlist"):
            kwargs["type"] = {"strlist": str, "intlist": int, "floatlist": float}[kind]
            kwargs["nargs"] = nargs or "+"
            if choices:
                kwargs["choices"] = list(choices)
        elif kind == "optstr":
            kwargs.update(type=str, nargs="?")
        else:
            kwargs["type"] = _TYPES[kind]
            if choices:
                kwargs["choices"] = list(choices)
        parser.add_argument(*names, **kwargs)


def build_parser(version_tuple) -> argparse.ArgumentParser:
    prog = "sglang serve" if version_tuple >= (0, 5, 10) else None
    parser = argparse.ArgumentParser(prog=prog)
    add_cli_args(parser, version_tuple)
    return parser


# --------------------------------------------------------------------------
# --config merging (utils/server_args_config_parser.py, docs/reference/sglang-processes.md, Config file)
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
    writes effective values into ``values`` (docs/reference/sglang-rules.md: raw versus
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
        # A field this release does not have (the engine code is shared by every emulated
        # release): the newest release's default, but it is not part of the record.
        newest = _newest_defaults()
        if name in newest:
            return newest[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        self.values[name] = value

    def resolve_once(self, ctx=None) -> None:
        """Run the resolution pipeline once (0.5.23 ``ServerArgs.resolve_once``).

        The launcher passes the context of the simulated node; called without one
        (as the collection's oracle helper calls a real SGLang), the context is read
        from the model's config.json and the GPU facts of ``torch.cuda`` when a
        torch module is importable, else an H200.  A second call does nothing.
        """
        if self.__dict__.get("_resolution_finished"):
            return
        from sglang.srt.resolution import resolve

        resolve(self, ctx if ctx is not None else self._context())
        object.__setattr__(self, "_resolution_finished", True)

    def _context(self):
        from sglang.srt import resolution
        from sglang.srt.sim_config import version_tuple

        model_config = resolution.read_model_config(self.model_path)
        draft_config, draft_arch = {}, None
        if self.values.get("speculative_draft_model_path") is not None:
            draft_config = resolution.read_model_config(self.speculative_draft_model_path)
            draft_arch = (draft_config.get("architectures") or [None])[0]
        gpu = _torch_gpu_facts()
        return resolution.ResolveContext(
            version_tuple(self.version), resolution.architecture_of(model_config), draft_arch=draft_arch,
            gpu_name=gpu["name"], gpu_total_mib=gpu["total_mib"], capability=gpu["capability"],
            enable_spec_v2=(os.environ.get("SGLANG_ENABLE_SPEC_V2") or "").lower() in ("1", "true"),
            draft_config=draft_config, model_dir=self.model_path, model_type=model_config.get("model_type"))

    def check_server_args(self) -> None:
        """The final validation (``check_server_args``) of the emulated release."""
        from sglang.srt.resolution import check_server_args
        from sglang.srt.sim_config import version_tuple

        check_server_args(self, version_tuple(self.version))

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
        # (docs/reference/sglang-processes.md, Secrets).
        hidden = ("watermark_key", "watermark_key_b", "watermark_config")
        if self._style == "dict":
            return repr({k: v for k, v in self.values.items() if k not in hidden})
        body = ", ".join(f"{k}={v!r}" for k, v in self.values.items() if k not in hidden)
        return f"ServerArgs({body})"


_NEWEST = {}


def _newest_defaults() -> dict:
    if not _NEWEST:
        _NEWEST.update(field_defaults(flag_table.RELEASE_TUPLES[-1]))
    return _NEWEST


def _torch_gpu_facts() -> dict:
    """Name, capability and memory of GPU 0 as ``torch.cuda`` reports them (never initialising it)."""
    facts = {"name": "NVIDIA H200", "capability": None, "total_mib": 143771}
    try:
        import torch
    except ImportError:
        return facts
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        return facts
    facts["name"] = cuda.get_device_name(0)
    facts["capability"] = tuple(cuda.get_device_capability(0))
    facts["total_mib"] = int(cuda.get_device_properties(0).total_memory // (1024 * 1024))
    return facts


def prepare_server_args(argv: list, version: str = None, version_tuple=None,
                        configure_logging: bool = True) -> ServerArgs:
    """argv (without the program) -> ServerArgs; argparse exits 2 on errors.

    The launcher passes the emulated version and resolves later with the node's
    context.  Called with ``argv`` alone (the real signature), the version comes
    from ``SGLANG_SIM_VERSION`` and, as in the real releases before 0.5.23 (whose
    dataclass resolves in ``__post_init__``), resolution runs here.
    """
    real_signature = version is None
    if real_signature:
        from sglang.srt.sim_config import emulated_version, version_tuple as to_tuple

        version = emulated_version()
        version_tuple = to_tuple(version)
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
    for name in field_names(version_tuple):
        values[name] = getattr(ns, name)
    style = "dict" if version_tuple >= (0, 5, 23) else "dataclass"
    server_args = ServerArgs(values, argv, version, style)
    if real_signature and version_tuple < (0, 5, 23):
        server_args.resolve_once()
    return server_args
