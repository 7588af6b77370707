/* A CUDA driver client that reaches the driver the ways a program can
 * around a preloaded shim, for crates/gpuslice/tests/escapes.rs.
 *
 *   driver_client HOW COUNT [hold]
 *
 * HOW: "dlvsym"  - glibc's own dlsym through dlvsym(RTLD_DEFAULT, "dlsym",
 *                  "GLIBC_2.34"), then the driver's functions from libcuda's
 *                  handle through it;
 *      "libc"    - glibc's own dlsym through dlsym(<libc.so.6's handle>,
 *                  "dlsym");
 *      "dlmopen" - libcuda loaded into a new link-map namespace, where no
 *                  shim is preloaded;
 *      "elf"     - libcuda dlopen'ed, set up through dlsym (the shim
 *                  sees the process join), then cuMemAlloc_v2's address
 *                  read from libcuda's ELF file's symbol table and called
 *                  (no lookup the shim sees);
 *      "elf-all" - the same for every driver function (the shim never
 *                  sees the process use the GPU);
 *      "next"    - the driver's functions from dlsym(RTLD_NEXT, ...) in a
 *                  library that has libcuda among its dependencies (its
 *                  path in $DRIVER_CLIENT_NEXT_LIB, exporting
 *                  `void *next_sym(const char *)`): the object after it
 *                  in its own scope is libcuda;
 *      "plain"   - dlopen + dlsym, the way the shim sees.
 * Allocates COUNT x 256 MiB with cuMemAlloc_v2, stopping at the first
 * failure, and prints one JSON line: {"how":..,"allocated":N,"rc":RC}
 * (rc: the failing call's CUresult, 0 if none failed; a refused dlmopen
 * prints "refused" with dlerror() and exits 3). With "hold" it then prints
 * "held" and sleeps until killed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *(*dlsym_fn)(void *, const char *);
typedef int (*init_fn)(unsigned);
typedef int (*device_get_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*set_current_fn)(void *);
typedef int (*alloc_fn)(unsigned long long *, size_t);

/* The address of `name` in the loaded object `h`, from the symbol table of
 * the object's file (as a program with its own ELF reader would). */
static void *elf_lookup(void *h, const char *name) {
    struct link_map *map = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) != 0 || !map)
        return NULL;
    FILE *f = fopen(map->l_name, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *img = malloc(size);
    if (!img || fread(img, 1, size, f) != (size_t)size) {
        fclose(f);
        return NULL;
    }
    fclose(f);
    Elf64_Ehdr *eh = (Elf64_Ehdr *)img;
    Elf64_Shdr *sh = (Elf64_Shdr *)(img + eh->e_shoff);
    void *found = NULL;
    for (int i = 0; i < eh->e_shnum && !found; i++) {
        if (sh[i].sh_type != SHT_DYNSYM && sh[i].sh_type != SHT_SYMTAB)
            continue;
        Elf64_Sym *syms = (Elf64_Sym *)(img + sh[i].sh_offset);
        const char *str = img + sh[sh[i].sh_link].sh_offset;
        size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t j = 0; j < n; j++) {
            if (syms[j].st_shndx != SHN_UNDEF && syms[j].st_value &&
                strcmp(str + syms[j].st_name, name) == 0) {
                found = (void *)(map->l_addr + syms[j].st_value);
                break;
            }
        }
    }
    free(img);
    return found;
}

static void *elf_sym(void *h, const char *name) { return elf_lookup(h, name); }

static void *(*next_lookup)(const char *);
static void *next_sym_of(void *h, const char *name) {
    (void)h;
    return next_lookup(name);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: driver_client dlvsym|libc|dlmopen|next|elf|elf-all|plain COUNT [hold]\n");
        return 2;
    }
    const char *how = argv[1];
    int count = atoi(argv[2]);
    void *h = NULL;
    dlsym_fn sym = dlsym;
    if (strcmp(how, "dlvsym") == 0) {
        sym = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
        if (!sym)
            sym = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
        h = dlopen("libcuda.so.1", RTLD_NOW);
    } else if (strcmp(how, "dlmopen") == 0) {
        h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
        if (!h) {
            const char *e = dlerror();
            printf("{\"how\":\"%s\",\"refused\":\"%s\"}\n", how, e ? e : "");
            fflush(stdout);
            return 3;
        }
    } else if (strcmp(how, "libc") == 0) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        sym = libc ? (dlsym_fn)dlsym(libc, "dlsym") : NULL;
        h = dlopen("libcuda.so.1", RTLD_NOW);
    } else if (strcmp(how, "next") == 0) {
        const char *lib = getenv("DRIVER_CLIENT_NEXT_LIB");
        void *l = lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
        void *(*next)(const char *) = l ? (void *(*)(const char *))dlsym(l, "next_sym") : NULL;
        if (!next) {
            fprintf(stderr, "driver_client: no next_sym (%s)\n", dlerror());
            return 2;
        }
        h = dlopen("libcuda.so.1", RTLD_NOW);
        next_lookup = next;
        sym = next_sym_of;
    } else if (strcmp(how, "elf-all") == 0) {
        h = dlopen("libcuda.so.1", RTLD_NOW);
        sym = elf_sym;
    } else {
        h = dlopen("libcuda.so.1", RTLD_NOW);
    }
    if (!h || !sym) {
        fprintf(stderr, "driver_client: no libcuda (%s)\n", dlerror());
        return 2;
    }
    init_fn cu_init = (init_fn)sym(h, "cuInit");
    device_get_fn device_get = (device_get_fn)sym(h, "cuDeviceGet");
    retain_fn retain = (retain_fn)sym(h, "cuDevicePrimaryCtxRetain");
    set_current_fn set_current = (set_current_fn)sym(h, "cuCtxSetCurrent");
    alloc_fn alloc = (alloc_fn)(strcmp(how, "elf") == 0 ? elf_sym : sym)(h, "cuMemAlloc_v2");
    if (!cu_init || !device_get || !retain || !set_current || !alloc) {
        fprintf(stderr, "driver_client: missing driver functions\n");
        return 2;
    }
    int dev = 0, rc = 0, n = 0;
    void *ctx = NULL;
    if ((rc = cu_init(0)) || (rc = device_get(&dev, 0)) || (rc = retain(&ctx, dev)) ||
        (rc = set_current(ctx))) {
        printf("{\"how\":\"%s\",\"allocated\":0,\"rc\":%d,\"setup\":true}\n", how, rc);
        return 1;
    }
    /* "elf": allocate after the shim has measured what the driver holds
     * for the new context (it measures once right after), as a program
     * would later in its life. */
    if (strcmp(how, "elf") == 0)
        usleep(500 * 1000);
    for (; n < count; n++) {
        unsigned long long p = 0;
        rc = alloc(&p, (size_t)256 << 20);
        if (rc)
            break;
    }
    printf("{\"how\":\"%s\",\"allocated\":%d,\"rc\":%d}\n", how, n, rc);
    fflush(stdout);
    if (argc > 3 && strcmp(argv[3], "hold") == 0) {
        printf("held\n");
        fflush(stdout);
        for (;;)
            pause();
    }
    return 0;
}
