/* References a function nothing provides. */
extern int orochi_test_missing_function(void);

int call_missing(void) { return orochi_test_missing_function(); }
