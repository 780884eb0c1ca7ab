# The baseline of the main branch, and two shards of a suite that has grown by three tests
# (one of which stops half-way), each run with its report, as the matrix's jobs do.
pytest -q --nobreak-update-baseline
cp pr/test_more.py tests/test_more.py
pytest -q --no-nobreak-strict tests/test_models.py --nobreak-json shard-1.json
pytest -q --no-nobreak-strict tests/test_more.py --nobreak-json shard-2.json
