// Red-team candidate victim: an honest library (no op either): the cache entry the poisoner goes after.
extern "C" int redteam_victim_answer() { return 42; }
