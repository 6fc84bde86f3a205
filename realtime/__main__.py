"""`python -m realtime`: load the model, start the engine, serve HTTP + WebSocket."""

from __future__ import annotations

import logging
import resource
import sys
from dataclasses import replace

import uvicorn

from engine.bundle import load_bundle
from engine.engine import Engine
from realtime.app import DrainingServer, build_app, uvicorn_options
from realtime.config import ServiceConfig, parse_args
from realtime.replicas import pin_gpu

# Python's GIL switch interval while serving: the decode thread gives the GIL up at every
# step and must then get it back; at the default 5 ms a step waited up to 5 ms behind the
# event loop or the codec thread ("The GIL switch interval" in latency_bench/RESULTS.md).
GIL_SWITCH_INTERVAL_S = 0.0005


# open files besides the connections' sockets: model files, logs, stored voices, the event loop
SPARE_FILES = 256


def raise_open_files(connections: int) -> int:
    """Each connection holds a socket: the soft limit on open files (often 1,024) goes up
    towards the hard one so that --max-connections can be reached. Returns the soft limit."""
    log = logging.getLogger("realtime")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + SPARE_FILES
    if soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft < wanted:
        log.warning("open files are limited to %d (hard limit): fewer than --max-connections %d needs (%d)",
                    soft, connections, wanted)
    return soft


def serve(config: ServiceConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    raise_open_files(config.max_connections)
    config = replace(config, device=pin_gpu(config.device))  # cuda:N: only GPU N visible, as cuda
    bundle = load_bundle(config.model, config.device, quant=config.quant)
    print(f"model {bundle.name} on {bundle.device} ({bundle.dtype}), loaded in {bundle.load_seconds:.1f} s", flush=True)
    engine = Engine(bundle, config.engine)
    app = build_app(config, engine)
    host = "localhost" if config.host in ("127.0.0.1", "::1") else config.host
    print(f"demo page:  http://{host}:{config.port}/", flush=True)
    print(f"live TTS:   ws://{host}:{config.port}/v1/tts/live", flush=True)
    if config.api_keys:
        print(f"API keys required ({len(config.api_keys)} configured)", flush=True)
    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level="info",
                                           **uvicorn_options(config)), app.state.services)
    try:
        server.run()  # returns after SIGTERM's drain (exit 0)
    except KeyboardInterrupt:  # SIGINT, raised again once uvicorn has shut down (as uvicorn.run allows)
        pass
    return 0 if server.started else 3  # 3: uvicorn's exit status for a failed start-up


def main(argv: list[str] | None = None) -> int:
    return serve(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
