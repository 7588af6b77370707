/* A library with libcuda among its dependencies (linked with
 * -Wl,--no-as-needed -lcuda) whose next_sym looks a name up with
 * dlsym(RTLD_NEXT, ...): the object after it in its own scope is libcuda,
 * so glibc answers with the driver's own function. For driver_client.c's
 * "next" (crates/gpuslice/tests/escapes.rs). */
#define _GNU_SOURCE
#include <dlfcn.h>
void *next_sym(const char *name) { return dlsym(RTLD_NEXT, name); }
