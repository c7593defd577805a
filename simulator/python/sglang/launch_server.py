"""Launch the (fake) inference server: ``python -m sglang.launch_server <flags>``.

Mirrors ``sglang/launch_server.py``: parse the arguments, resolve them, run
the server inside a ``finally`` that kills the process tree (docs/reference/sglang-processes.md, Config file).
"""
import os
import sys
import warnings

# Every server start runs several interpreters; compiling this package (the
# 522-row flag table included) each time is a noticeable part of a test's
# start-up on a loaded 2-core runner.  Cache bytecode (``__pycache__`` is
# git-ignored) even under PYTHONDONTWRITEBYTECODE, as the gpusim wrappers do;
# an unwritable tree just falls back to compiling.  Only in the server
# processes: importing the package elsewhere changes nothing.
if __name__ == "__main__":
    sys.dont_write_bytecode = False

from sglang.srt.sim_config import Knobs, SimConfigError  # noqa: E402 - after the bytecode switch above


def _gpu_context(knobs, sa):
    """The simulated node, visible GPUs and the first visible GPU's properties."""
    from gpusim.node import DriverError, Node

    try:
        node = Node.from_env()
        node.driver_state()
    except (DriverError, OSError, ValueError) as e:
        raise RuntimeError(
            "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
            "and installed a driver from http://www.nvidia.com/Download/index.aspx "
            f"(simulator: {e})") from None
    if node.driver_state() != "loaded":
        raise RuntimeError("CUDA driver initialization failed, you might not have a CUDA gpu.")
    visible = node.resolve_visible(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not visible:
        raise RuntimeError("No CUDA GPUs are available")
    gpus = {g["index"]: g for g in node.gpus()}
    first = gpus[visible[0]]
    return node, visible, first


def run_server(server_args, knobs):
    from sglang.srt import resolution
    from sglang.srt.entrypoints.engine import Engine

    node, visible, gpu = _gpu_context(knobs, server_args)
    model_config = resolution.read_model_config(server_args.model_path)
    arch = resolution.architecture_of(model_config)
    draft_config, draft_arch = {}, None
    if server_args.speculative_draft_model_path is not None:
        draft_config = resolution.read_model_config(server_args.speculative_draft_model_path)
        draft_arch = (draft_config.get("architectures") or [None])[0]
    ctx = resolution.ResolveContext(
        knobs.vt, arch, draft_arch=draft_arch, gpu_name=gpu["name"],
        gpu_total_mib=gpu["total_mib"], enable_spec_v2=knobs.enable_spec_v2,
        draft_config=draft_config, model_dir=server_args.model_path)
    server_args.resolve_once(ctx)
    server_args.log()
    engine = Engine(server_args, knobs, model_config, ctx, node)
    engine.visible = visible
    run_server.engine = engine
    return engine.run()


def main():
    try:
        knobs = Knobs()
    except SimConfigError as e:
        sys.stderr.write(f"sglang simulator: {e}\n")
        sys.exit(2)
    if knobs.at_least(0, 5, 23):
        warnings.warn(
            "'python -m sglang.launch_server' is still supported, but "
            "'sglang serve' is the recommended entrypoint.\n"
            "  Example: sglang serve --model-path <model> [options]",
            UserWarning,
            stacklevel=1,
        )
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sys.argv[1:], knobs.version, knobs.vt)
    code = 1
    try:
        code = run_server(server_args, knobs)
    finally:
        engine = getattr(run_server, "engine", None)
        if engine is not None:
            engine.kill_process_tree(include_parent=False)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
