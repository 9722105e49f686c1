// Fixture of tests/core/check_crosscheck_pins.py (not compiled): one pin with a wrong count,
// every other op unpinned.
expect_crosscheck_pins("add", 2, {});
