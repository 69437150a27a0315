/* Binds to the old answer@V1 on purpose: a loader that ignores versions gets answer@@V2. */
__asm__(".symver answer, answer@V1");
extern int answer(void);

int versioned_answer(void) { return answer(); }
