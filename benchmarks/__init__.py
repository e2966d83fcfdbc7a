"""fcall's benchmarks: one runner (``python -m benchmarks``), suites that declare their cells
as data, and one harness (``_harness``: timing, processes, JSON) and report (``_report``)."""
