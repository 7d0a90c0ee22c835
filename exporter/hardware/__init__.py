"""The hardware and model facts of the roofline, as pure arithmetic.

* :mod:`.gpus` turns the facts NVML reports about a GPU (memory bus width, maximum memory and
  SM clocks, CUDA core count, compute capability) into its theoretical peak memory bandwidth
  and dense tensor FLOPs, with the per-architecture and per-product tables that needs.
* :mod:`.models` turns a Hugging Face ``config.json`` into parameter counts, KV-cache bytes per
  token and forward FLOPs per token.
* :mod:`.roofline` holds the floor arithmetic the rules and ``diagnose`` build on
  (:func:`~.roofline.decode_floor_seconds`, :func:`~.roofline.prefill_flops`).

Nothing here does I/O, calls NVML or knows Prometheus: the backends read the facts
(:mod:`exporter.backends.gpu_reader`, :mod:`exporter.backends.hfmodel`), the collectors export them,
and the same functions serve the rules, ``diagnose`` and the tests. ``docs/roofline.md``
explains the arithmetic and what it leaves out.
"""
