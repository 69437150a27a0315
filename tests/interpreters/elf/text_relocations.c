/* Built without -fPIC and linked with -z notext: its code holds absolute addresses that the
 * loader would have to patch in place (text relocations). */
int textrel_value = 7;
int textrel_read(void) { return textrel_value; }
