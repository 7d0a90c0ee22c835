"""The reference inference engine: a small, real LLM server to run the pack against.

Optional extra ``reference`` (torch, tokenizers). Nothing the sidecar imports may import this
package; the modules that need torch (:mod:`.model`, :mod:`.worker`) import it themselves, and
only the model worker process loads them. The front-end (:mod:`.server`), the tokenizer
(:mod:`.tokenizer`), the injections (:mod:`.inject`) and the drill traces (:mod:`.gputrace`)
need no torch; the host's peaks for the traces are measured with torch in a child process
(:mod:`.hostpeak`), as the model worker would see them.

Layout, as in vLLM's V1 engine::

    front-end process (aiohttp)                     model worker process (torch)
      /v1/completions, /tokenize, /health,   pipe     request queue, continuous batching,
      /metrics (vLLM names), tokenizer,     <---->    KV cache tensors, prefill + decode,
      detokenizer, SSE streaming                      per-step outputs and stats

Disaggregated (``--role prefill|decode``), two such servers hand each request's KV cache over
a loopback link (:mod:`.kv_transfer`), the decode one in front::

    client -> decode server --(prompt, kv_transfer_params)--> prefill server (runs the prompt)
              decode server <--(the prompt's KV cache, TCP)-- prefill server (holds it)
              decode server: generation continues from the cache

Run it with ``python -m exporter.lab.refengine --help``.
"""

from __future__ import annotations

DEFAULT_MODEL_NAME = "reference-tiny"
