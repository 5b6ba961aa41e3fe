"""The dispatch audit: which attention backend each call really ran (`watch`), why not a faster one (`explain`),
and the test assertion that forbids fallbacks (`expect_fused`)."""

from attnprof.audit.expect import expect_fused
from attnprof.audit.reasons import explain
from attnprof.dispatch.watch import DispatchRecord, watch

__all__ = ["watch", "explain", "expect_fused", "DispatchRecord"]
