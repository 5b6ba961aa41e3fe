"""Reading fd 2: c10 warnings printed by C++ (where Python's `warnings` never sees them) become reasons."""

import os

from attnprof.stderr import c10_warnings, capture_fd2


def test_fd2_output_is_captured_and_kept_off_the_terminal():
    with capture_fd2() as lines:
        os.write(2, b"[W1202 12:07:01.123456789 sdp_utils.cpp:412] Warning: Flash attention requires q,k,v to "
                    b"have the same last dimension and to be less than or equal to 256. Got Query.size(-1): 320. "
                    b"(function check_head_dim_size_flash)\nplain line\n")
    assert lines[-1] == "plain line"
    assert c10_warnings(lines) == ["Flash attention requires q,k,v to have the same last dimension and to be less "
                                   "than or equal to 256. Got Query.size(-1): 320."]


def test_lines_that_are_not_c10_warnings_are_not_reasons():
    assert c10_warnings(["USDT:2026-12-02 11:35:31 7296:7296 SyncActivityProfilerHandler.cpp:52] profiler_start"]) == []
