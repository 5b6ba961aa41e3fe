from attnprof.audit.expect import expect_fused

__all__ = ["expect_fused"]
