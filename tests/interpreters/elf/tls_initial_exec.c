/* Initial-exec TLS needs a slot in the static TLS block, which only the system loader has. */
__attribute__((tls_model("initial-exec"))) __thread int ie_counter = 1;

int ie_increment(void) { return ++ie_counter; }
