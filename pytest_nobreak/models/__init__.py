"""``--nobreak-model SPEC``: the grammar, building the model, ``hf:`` architectures, the items."""
