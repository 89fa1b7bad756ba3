# s20 call 9: the plugin's enqueue tests on this tree's plan (HEAD's library).
[ -e moe_build/plugins ] || ln -s ../plugins moe_build/plugins
[ -e moe_build/cpp ] || ln -s ../cpp moe_build/cpp
timeout 200 python -m pytest -q -p no:cacheprovider tests/gpu/test_plugin_enqueue.py > $OUT/gpu_tests_plugin_enqueue.log 2>&1
tail -n 2 $OUT/gpu_tests_plugin_enqueue.log; grep -E "^FAILED" $OUT/gpu_tests_plugin_enqueue.log | head -5
