/* Thread-local storage through __tls_get_addr (general dynamic, as -fPIC code uses). */
__thread int tls_counter = 5;
__thread char tls_buffer[256];

int tls_increment(void) { return ++tls_counter; }
int* tls_counter_address(void) { return &tls_counter; }
char* tls_buffer_address(void) { return tls_buffer; }
