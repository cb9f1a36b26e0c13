/*
 * A C program that uses atlasboost's C ABI as a worker would, and checks every answer against
 * what the launcher told the process (its environment) and against the rank table on disk.
 * Run by tests/c_program.rs; C99, only atlasboost.h and libc (POSIX setenv/unsetenv).
 *
 *   test_init before-init   alone, no init: every query fails with NOT_INITIALIZED, a bad
 *                           frame name is an invalid argument
 *   test_init launched      under `atlasboost run`: init, queries, set_device_id, finalize,
 *                           init again
 *   test_init alone         no launcher, simulated devices: init makes a world of one
 *   test_init init-fails ATLASBOOST_ERR_...
 *                           init(NULL) fails with that code and a message; nothing is
 *                           initialised
 *
 * It prints one line per check ("ok: ...") and a last line "test_init: <mode>: N checks
 * passed" (prefixed with the rank under a launcher); on the first mismatch it prints
 * "test_init: FAILED: ..." on stderr and exits 1.
 */
#define _POSIX_C_SOURCE 200112L

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "atlasboost.h"

static const char *mode = "?";
static int checks = 0;
static int my_rank = -1;

static void fail(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "test_init: FAILED (%s", mode);
    if (my_rank >= 0) {
        fprintf(stderr, ", rank %d", my_rank);
    }
    fprintf(stderr, "): ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

/* Fails with the description unless ok; prints it otherwise. */
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    if (!ok) {
        char what[1024];
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        fail("%s", what);
    }
    checks++;
    printf("ok: ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static const char *last_error_or(const char *none) {
    const char *e = atlasboost_last_error();
    return e != NULL ? e : none;
}

/* Checks that a call returned `want`; on failure says what it returned and why. */
static void check_code(int got, int want, const char *call) {
    check(got == want, "%s returns %s (got %d = %s; last error: %s)", call,
          atlasboost_error_name(want), got, atlasboost_error_name(got),
          last_error_or("(none)"));
}

/* Checks that the calling thread's last error contains `needle`. */
static void check_error_mentions(const char *needle, const char *after) {
    const char *e = atlasboost_last_error();
    check(e != NULL && strstr(e, needle) != NULL, "after %s, last_error mentions \"%s\" (%s)",
          after, needle, e != NULL ? e : "NULL");
}

/* Whether `text` has "device N" with no digit after N. */
static int mentions_device(const char *text, int n) {
    char needle[32];
    const char *p = text;
    size_t len;
    snprintf(needle, sizeof needle, "device %d", n);
    len = strlen(needle);
    while ((p = strstr(p, needle)) != NULL) {
        char next = p[len];
        if (next < '0' || next > '9') {
            return 1;
        }
        p += len;
    }
    return 0;
}

static const char *need_env(const char *name) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') {
        fail("%s is not set: run this mode under `atlasboost run`", name);
    }
    return v;
}

/* A copy of a variable, which unsetenv/setenv would otherwise invalidate. */
static char *copy_env(const char *name) {
    const char *v = need_env(name);
    char *copy = malloc(strlen(v) + 1);
    if (copy == NULL) {
        fail("out of memory");
    }
    strcpy(copy, v);
    return copy;
}

static int to_int(const char *name, const char *value) {
    char *end;
    long n = strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || n < 0 || n > 1000000) {
        fail("%s=%s is not a number", name, value);
    }
    return (int)n;
}

static int file_exists(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    fclose(f);
    return 1;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf;
    size_t n = 0, cap = 4096, got;
    if (f == NULL) {
        fail("cannot open %s", path);
    }
    buf = malloc(cap);
    while (buf != NULL && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf == NULL) {
        fail("out of memory reading %s", path);
    }
    buf[n] = '\0';
    return buf;
}

/* Reads the JSON string starting at p (just after its opening quote) into out; returns the
 * position after its closing quote. */
static const char *json_string(const char *p, char *out, size_t size) {
    size_t n = 0;
    while (*p != '\0' && *p != '"') {
        if (*p == '\\' && p[1] != '\0') {
            p++;
        }
        if (n + 1 < size) {
            out[n++] = *p;
        }
        p++;
    }
    out[n] = '\0';
    return *p == '"' ? p + 1 : p;
}

static const char *skip_space(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') {
        p++;
    }
    return p;
}

/*
 * The rank_id of device `physical` of server `server` in a rank table (the layout atlasboost
 * writes: server_list[] objects with "server_id" before "device", whose objects have
 * "device_id" and "rank_id"), or -1 if it has none; *devices is set to the number of devices
 * in the table. A scan of the JSON's strings, not a JSON parser.
 */
static int table_rank(const char *path, const char *server, const char *physical,
                      int *devices) {
    char *json = read_file(path);
    const char *p = json;
    char key[256], value[256], current_server[256] = "", device_id[256] = "",
                                                     rank_id[256] = "";
    int found = -1;
    *devices = 0;
    while (*p != '\0') {
        if (*p == '{' || *p == '}') {
            if (*p == '}' && device_id[0] != '\0' && rank_id[0] != '\0') {
                (*devices)++;
                if (strcmp(current_server, server) == 0 && strcmp(device_id, physical) == 0) {
                    found = to_int("rank_id", rank_id);
                }
            }
            device_id[0] = rank_id[0] = '\0';
            p++;
        } else if (*p == '"') {
            p = skip_space(json_string(p + 1, key, sizeof key));
            if (*p != ':') {
                continue; /* a string in an array */
            }
            p = skip_space(p + 1);
            if (*p != '"') {
                continue; /* a number, an array or an object */
            }
            p = json_string(p + 1, value, sizeof value);
            if (strcmp(key, "server_id") == 0) {
                strcpy(current_server, value);
            } else if (strcmp(key, "device_id") == 0) {
                strcpy(device_id, value);
            } else if (strcmp(key, "rank_id") == 0) {
                strcpy(rank_id, value);
            }
        } else {
            p++;
        }
    }
    free(json);
    return found;
}

static int before_init(void) {
    const char *e;
    check(atlasboost_last_error() == NULL, "last_error is NULL before any call");
    /* Alone, nobody listens to heartbeats; the call needs no init and changes nothing. */
    check(atlasboost_heartbeat() == 0 && atlasboost_heartbeat_step(7) == 0,
          "heartbeat() alone returns 0 (no launcher listens)");
    check(atlasboost_last_error() == NULL, "last_error is NULL after heartbeat()");
    check_code(atlasboost_rank(), ATLASBOOST_ERR_NOT_INITIALIZED, "rank() before init");
    check_error_mentions("call init() first", "rank()");
    check_code(atlasboost_size(), ATLASBOOST_ERR_NOT_INITIALIZED, "size() before init");
    check_error_mentions("call init() first", "size()");
    check_code(atlasboost_local_rank(), ATLASBOOST_ERR_NOT_INITIALIZED,
               "local_rank() before init");
    check_error_mentions("call init() first", "local_rank()");
    check_code(atlasboost_launcher_rank(), ATLASBOOST_ERR_NOT_INITIALIZED,
               "launcher_rank() before init");
    /* A call that succeeds clears the last error, heartbeat() too. */
    check(atlasboost_heartbeat_step(3) == 0 && atlasboost_last_error() == NULL,
          "heartbeat_step() after a failed call clears the last error");
    check_code(atlasboost_local_size(), ATLASBOOST_ERR_NOT_INITIALIZED,
               "local_size() before init");
    check_error_mentions("call init() first", "local_size()");
    check_code(atlasboost_device_id(), ATLASBOOST_ERR_NOT_INITIALIZED,
               "device_id() before init");
    check_error_mentions("call init() first", "device_id()");
    check(atlasboost_rank_table_file() == NULL, "rank_table_file() is NULL before init");
    check_error_mentions("call init() first", "rank_table_file()");
    check_code(atlasboost_set_device_id(0), ATLASBOOST_ERR_NOT_INITIALIZED,
               "set_device_id(0) before init");
    check_error_mentions("call init() first", "set_device_id(0)");
    check_code(atlasboost_set_device_id(-1), ATLASBOOST_ERR_INVALID_ARGUMENT,
               "set_device_id(-1)");
    check_error_mentions("-1", "set_device_id(-1)");

    check_code(atlasboost_init("caffe"), ATLASBOOST_ERR_INVALID_ARGUMENT, "init(\"caffe\")");
    e = last_error_or("");
    check(strstr(e, "caffe") != NULL && strstr(e, "tensorflow") != NULL &&
              strstr(e, "mindspore") != NULL && strstr(e, "pytorch") != NULL,
          "init(\"caffe\")'s message names caffe, tensorflow, mindspore and pytorch (%s)", e);
    check_code(atlasboost_init("\xff\xfe"), ATLASBOOST_ERR_INVALID_ARGUMENT,
               "init(not UTF-8)");
    check_error_mentions("UTF-8", "init(not UTF-8)");
    check_code(atlasboost_rank(), ATLASBOOST_ERR_NOT_INITIALIZED,
               "rank() after a refused init");

    check_code(atlasboost_finalize(), ATLASBOOST_OK, "finalize() with nothing to end");
    check(atlasboost_last_error() == NULL, "last_error is NULL after a call that succeeded");
    check(strcmp(atlasboost_error_name(ATLASBOOST_ERR_DEVICE), "ATLASBOOST_ERR_DEVICE") == 0 &&
              strcmp(atlasboost_error_name(12345), "ATLASBOOST_UNKNOWN") == 0,
          "error_name names codes");
    check(strncmp(atlasboost_build_info(), "atlasboost ", 11) == 0 &&
              strstr(atlasboost_build_info(), "(MPI support: ") != NULL,
          "build_info says what the library has");
    check(atlasboost_last_error() == NULL, "build_info leaves last_error alone");
    printf("build: %s\n", atlasboost_build_info());
    /* The codes are parenthesised macros: this would not compile with a bare -5. */
    check(10 - ATLASBOOST_ERR_DEVICE == 15, "10 - ATLASBOOST_ERR_DEVICE == 15");
    return 0;
}

static int launched(void) {
    /* What the launcher gave this process, before init can change anything. */
    char *rank_id = copy_env("RANK_ID");
    char *device_env = copy_env("DEVICE_ID");
    char *table_env = copy_env("RANK_TABLE_FILE");
    int rank_size = to_int("RANK_SIZE", need_env("RANK_SIZE"));
    int local_world_size = to_int("LOCAL_WORLD_SIZE", need_env("LOCAL_WORLD_SIZE"));
    int local_rank_env = to_int("LOCAL_RANK", need_env("LOCAL_RANK"));
    int launcher_rank_env = to_int("RANK", need_env("RANK"));
    const char *server = need_env("ATLASBOOST_SERVER_ID");
    const char *physical = need_env("ATLASBOOST_PHYSICAL_ID");
    int rank_env = to_int("RANK_ID", rank_id);
    int device = to_int("DEVICE_ID", device_env);
    int rank, devices, entry, wrong;
    const char *table, *again, *e;

    my_rank = rank_env;
    /* Removed, so that init must put them back (it exports the job's variables). Safe here:
     * this program has one thread. */
    if (unsetenv("RANK_ID") != 0 || unsetenv("DEVICE_ID") != 0 ||
        unsetenv("RANK_TABLE_FILE") != 0) {
        fail("unsetenv failed");
    }
    /* `atlasboost run` gives every worker a heartbeat file, read by its watchdog. */
    check(getenv("ATLASBOOST_HEARTBEAT_FILE") != NULL && atlasboost_heartbeat_step(1) == 1,
          "heartbeat_step() under atlasboost run returns 1 (the launcher listens)");
    check_code(atlasboost_init("tensorflow"), ATLASBOOST_OK, "init(\"tensorflow\")");
    check(atlasboost_last_error() == NULL, "last_error is NULL after init succeeded");
    check(getenv("RANK_ID") != NULL && strcmp(getenv("RANK_ID"), rank_id) == 0,
          "init exported RANK_ID=%s", rank_id);
    check(getenv("DEVICE_ID") != NULL && strcmp(getenv("DEVICE_ID"), device_env) == 0,
          "init exported DEVICE_ID=%s", device_env);
    check(getenv("RANK_TABLE_FILE") != NULL && strcmp(getenv("RANK_TABLE_FILE"), table_env) == 0,
          "init exported RANK_TABLE_FILE=%s", table_env);

    rank = atlasboost_rank();
    check(rank == rank_env, "rank() == RANK_ID (%d, got %d)", rank_env, rank);
    check(atlasboost_size() == rank_size, "size() == RANK_SIZE (%d, got %d)", rank_size,
          atlasboost_size());
    check(atlasboost_local_rank() == local_rank_env, "local_rank() == LOCAL_RANK (%d, got %d)",
          local_rank_env, atlasboost_local_rank());
    check(atlasboost_launcher_rank() == launcher_rank_env,
          "launcher_rank() == the launcher's RANK (%d, got %d)", launcher_rank_env,
          atlasboost_launcher_rank());
    check(atlasboost_local_size() == local_world_size,
          "local_size() == LOCAL_WORLD_SIZE (%d, got %d)", local_world_size,
          atlasboost_local_size());
    check(atlasboost_device_id() == device, "device_id() == DEVICE_ID (%d, got %d)", device,
          atlasboost_device_id());

    table = atlasboost_rank_table_file();
    check(table != NULL && strcmp(table, table_env) == 0,
          "rank_table_file() == RANK_TABLE_FILE (%s, got %s)", table_env,
          table != NULL ? table : "NULL");
    check(file_exists(table), "the rank table %s exists", table);
    again = atlasboost_rank_table_file();
    check(again == table, "rank_table_file() returns the same string every time");
    entry = table_rank(table, server, physical, &devices);
    check(entry == rank, "the table's entry for device %s of %s has rank_id %d (got %d)",
          physical, server, rank, entry);
    check(devices == atlasboost_size(), "the table has size() devices (%d, got %d)",
          atlasboost_size(), devices);

    check_code(atlasboost_set_device_id(device), ATLASBOOST_OK, "set_device_id(own device)");
    wrong = device + 1;
    check_code(atlasboost_set_device_id(wrong), ATLASBOOST_ERR_DEVICE,
               "set_device_id(another device)");
    e = last_error_or("");
    check(mentions_device(e, wrong) && mentions_device(e, device),
          "set_device_id(%d)'s message names device %d and device %d (%s)", wrong, wrong,
          device, e);
    check_code(atlasboost_set_device_id(-1), ATLASBOOST_ERR_INVALID_ARGUMENT,
               "set_device_id(-1)");

    check_code(atlasboost_init(NULL), ATLASBOOST_OK, "a second init(NULL)");
    check(atlasboost_rank() == rank, "rank() unchanged after the second init");
    check_code(atlasboost_init("caffe"), ATLASBOOST_ERR_INVALID_ARGUMENT,
               "init(\"caffe\") after init");

    check_code(atlasboost_finalize(), ATLASBOOST_OK, "finalize()");
    check_code(atlasboost_rank(), ATLASBOOST_ERR_NOT_INITIALIZED, "rank() after finalize");
    check_error_mentions("call init() first", "rank() after finalize");
    check(atlasboost_rank_table_file() == NULL, "rank_table_file() is NULL after finalize");
    check_code(atlasboost_device_id(), ATLASBOOST_ERR_NOT_INITIALIZED,
               "device_id() after finalize");
    check_code(atlasboost_finalize(), ATLASBOOST_OK, "a second finalize()");

    check_code(atlasboost_init(NULL), ATLASBOOST_OK, "init(NULL) after finalize");
    check(atlasboost_rank() == rank && atlasboost_device_id() == device,
          "the same rank and device after init again");
    check_code(atlasboost_finalize(), ATLASBOOST_OK, "finalize() again");
    free(rank_id);
    free(device_env);
    free(table_env);
    return rank;
}

/*
 * init, finalize, init again, twice: each later start finds this process's place as the first
 * did, though every start exports the table's RANK (and MASTER_ADDR) over the launcher's.
 * Returns the launcher's rank.
 */
static int reinit(void) {
    int launcher_rank, rank, again, round;
    check_code(atlasboost_init(NULL), ATLASBOOST_OK, "init(NULL)");
    launcher_rank = atlasboost_launcher_rank();
    rank = atlasboost_rank();
    check_code(atlasboost_finalize(), ATLASBOOST_OK, "finalize()");
    for (round = 2; round <= 3; round++) {
        check_code(atlasboost_init(NULL), ATLASBOOST_OK, "init(NULL) after finalize()");
        again = atlasboost_launcher_rank();
        check(again == launcher_rank, "launcher_rank() after init number %d is still %d (got %d)",
              round, launcher_rank, again);
        check(atlasboost_rank() == rank, "rank() after init number %d is still %d (got %d)",
              round, rank, atlasboost_rank());
        check_code(atlasboost_finalize(), ATLASBOOST_OK, "finalize() after a later init");
    }
    return launcher_rank;
}

static int alone(void) {
    const char *table, *e;
    char lock[4096];
    pid_t child;
    int status = 0;
    int had_cm = getenv("CM_CHIEF_IP") != NULL;
    if (getenv("RANK_ID") != NULL || getenv("ATLASBOOST_RANK") != NULL) {
        fail("run this mode without a launcher's variables");
    }
    check_code(atlasboost_init(NULL), ATLASBOOST_OK, "init(NULL) with no launcher");
    if (had_cm) {
        /* HCCL refuses its cluster-information variables beside RANK_TABLE_FILE. */
        check(getenv("CM_CHIEF_IP") == NULL, "init removed CM_CHIEF_IP");
    }
    check(atlasboost_rank() == 0 && atlasboost_size() == 1, "a world of one: rank 0 of 1");
    check(atlasboost_local_rank() == 0 && atlasboost_local_size() == 1, "local rank 0 of 1");
    check(atlasboost_device_id() == 0, "device 0 (got %d)", atlasboost_device_id());
    table = atlasboost_rank_table_file();
    check(table != NULL && file_exists(table), "the rank table %s exists",
          table != NULL ? table : "NULL");
    check(getenv("RANK_ID") != NULL && strcmp(getenv("RANK_ID"), "0") == 0,
          "init exported RANK_ID=0");
    check(getenv("RANK_TABLE_FILE") != NULL && strcmp(getenv("RANK_TABLE_FILE"), table) == 0,
          "init exported RANK_TABLE_FILE=%s", table);
    check_code(atlasboost_set_device_id(1), ATLASBOOST_ERR_DEVICE, "set_device_id(1)");
    e = last_error_or("");
    check(mentions_device(e, 1) && mentions_device(e, 0),
          "set_device_id(1)'s message names device 1 and device 0 (%s)", e);
    /* A child forked now that finalizes as it exits (an atexit(atlasboost_finalize), as the
       header suggests, runs in it too) must leave the parent's job alone: its table lock. */
    snprintf(lock, sizeof lock, "%s.lock", table);
    check(file_exists(lock), "the table's lock %s exists while the job runs", lock);
    child = fork();
    if (child == 0) {
        _exit(atlasboost_finalize() == ATLASBOOST_OK ? 0 : 1);
    }
    check(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "a forked child's finalize() returns OK");
    check(file_exists(lock), "the lock is still there after a forked child's finalize()");
    check_code(atlasboost_finalize(), ATLASBOOST_OK, "finalize()");
    check(!file_exists(lock), "the parent's finalize() removed the lock");
    return 0;
}

static int init_fails(const char *want) {
    int rc = atlasboost_init(NULL);
    const char *e = last_error_or("");
    check(strcmp(atlasboost_error_name(rc), want) == 0, "init(NULL) returns %s (got %d = %s)",
          want, rc, atlasboost_error_name(rc));
    check(*e != '\0', "with a message: %s", e);
    check_code(atlasboost_rank(), ATLASBOOST_ERR_NOT_INITIALIZED, "rank() after init failed");
    return 0;
}

int main(int argc, char **argv) {
    int rank;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || (strcmp(argv[1], "init-fails") == 0) != (argc == 3) || argc > 3) {
        fprintf(stderr,
                "usage: test_init before-init|launched|alone|reinit|init-fails CODE_NAME\n");
        return 2;
    }
    mode = argv[1];
    if (strcmp(mode, "init-fails") == 0) {
        init_fails(argv[2]);
        printf("test_init: init-fails: %d checks passed\n", checks);
    } else if (strcmp(mode, "before-init") == 0) {
        before_init();
        printf("test_init: before-init: %d checks passed\n", checks);
    } else if (strcmp(mode, "launched") == 0) {
        rank = launched();
        printf("test_init: launched: rank %d: %d checks passed\n", rank, checks);
    } else if (strcmp(mode, "reinit") == 0) {
        rank = reinit();
        printf("test_init: reinit: launcher rank %d: %d checks passed\n", rank, checks);
    } else if (strcmp(mode, "alone") == 0) {
        alone();
        printf("test_init: alone: %d checks passed\n", checks);
    } else {
        fprintf(stderr, "test_init: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
