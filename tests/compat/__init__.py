"""Tests that downstream libraries' uses of Monarch behave as on Monarch 0.7."""
