"""Models in and out of memory.

    models.py          load a policy (full, LoRA, QLoRA), its reference (a frozen copy, or the adapter switched off),
                       save it; the device
    tokenizer.py       the shipped tiny models' character tokenizer
    chat_templates.py  chat templates for models that ship none
    peak_memory.py     the device's peak memory, for summary.json and the lab
"""
