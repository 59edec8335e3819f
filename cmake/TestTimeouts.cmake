# Each test's TIMEOUT: 5x the longest of its measured wall times (scripts/suite_report.py timeouts);
# none measured yet: every test keeps the TIMEOUT it declares.
