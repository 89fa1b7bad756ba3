step tests_runner_woq 280 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_runner_woq.py tests/gpu/test_runner_woq_checkpoints.py
echo "==== tests_runner_woq"; grep -E "^(FAILED|ERROR)" "$R/tests_runner_woq.log" | head -8; grep -E "^SKIPPED" "$R/tests_runner_woq.log" | head -5; tail -n 2 "$R/tests_runner_woq.log"
