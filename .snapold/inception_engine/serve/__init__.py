"""``inception-serve``: a resident engine behind the Open Inference Protocol (KServe v2) over HTTP, as Triton speaks it.

    protocol.py  requests parsed and checked, responses built (JSON and Triton's binary tensor data), metadata
    devices.py   one Engine per device: a thread of this process, or a worker process per GPU where several
    batcher.py   dynamic batching: every connection's images joined into batches, spread over the devices
    app.py       the ASGI application (Starlette): routes, limits, metrics (prometheus-client)
    command.py   the console command (uvicorn), start-up and graceful stop
    hub.py       --http-workers N: the engine process, and the N HTTP front-end processes it starts
    frontends.py their hand-off: a shared-memory arena per front-end, messages on a Unix socket
    client.py    inception-run --server: a local run's predictions, computed by a running server
    wire.py      the protocol's names and a client's request and answer (NumPy-free, for client.py)
"""
