"""The rollout server: one HTTP protocol over a pluggable engine (transformers anywhere, vLLM on GPUs).

`app.build_app` is the ASGI application (training endpoints, weight and adapter sync with
checksums, OpenAI-compatible routes); `backends/` hold the engines; `launch.serve` is what
`rlft vllm-serve CONFIG` runs. The client is `rlft.rollout.remote.RemoteEngine`.
"""
