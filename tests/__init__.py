"""The lab's tests, in rooms that mirror the house: engine/ (mini_engine), tasks/ (a lesson's or a
few lessons'), lab/ (the lab as a whole). What they share: helpers.py (functions and constants),
conftest.py (fixtures and hooks), hand/ (records built by hand). A package, so each test module
has one dotted name (tests.engine.test_engine) and no room's name shadows a script (lab.py)."""
