"""The lab: what measures, draws and demonstrates minigrpo, kept apart from the library a student lifts.

    bench.py, bench_length.py, bench_vllm.py   step time and memory against TRL, by completion length, against vLLM
    memory.py, memory_sharded.py               measured and computed memory per setup, recipe and process count
    plots.py                                   every figure: the CLI's `minigrpo plot`, the notebooks, a run's plots/
    show.py                                    `minigrpo show`: a run's completions as tables
    standin.py                                 offline stand-ins for hub models (random weights, real chat templates)
    cast_engine.py                             a sampler in bfloat16 beside a float32 trainer: the engine mismatch, no vLLM
    notebook.py                                the notebooks' first cell: versions, threads, fast mode

The library (floors 1-3) never imports the lab, except the plots a finished run draws (run.finish_run, lazily).
"""
