/* A library with two versions of one symbol: answer@V1 (old) and answer@@V2 (the default). */
int answer_v1(void) { return 1; }
int answer_v2(void) { return 2; }
__asm__(".symver answer_v1, answer@V1");
__asm__(".symver answer_v2, answer@@V2");
