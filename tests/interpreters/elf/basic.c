/* A small object for the ELF loader's tests: symbols from the resolver (a function and data),
 * from its own definitions and from libc, .bss, a constructor and a destructor. */
#include <string.h>

extern int host_add(int a, int b);
extern const char host_greeting[];
extern void host_note_destroyed(void);

int basic_constructed = 0;
static int basic_bss[1024];

__attribute__((constructor)) static void construct(void) { basic_constructed = 42; }
__attribute__((destructor)) static void destroy(void) { host_note_destroyed(); }

int basic_add(int a, int b) { return host_add(a, b) + 1; }
const char* basic_greeting(void) { return host_greeting; }
size_t basic_strlen(const char* text) { return strlen(text); }
int* basic_bss_address(void) { return basic_bss; }
int basic_calls_own_export(void) { return basic_add(1, 1); }
