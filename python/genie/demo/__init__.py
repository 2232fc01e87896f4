"""The demo: MiniLM, GPT-2 and ResNet-50 run locally and on a Genie device (``python -m genie.demo``).

``models`` builds each model and its inputs offline; ``harness`` runs and checks them;
``measure`` times runs and reads Genie's client counters. ``perf/bench_models.py`` reuses all three.
"""
