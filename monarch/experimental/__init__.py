"""Monarch 0.7's ``monarch.experimental``: utilities outside the supported API."""

from monarch.experimental.thread_timeout import ThreadTimeout, ThreadTimeoutError

__all__ = ["ThreadTimeout", "ThreadTimeoutError"]
