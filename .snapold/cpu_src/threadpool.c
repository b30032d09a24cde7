// threadpool.c: the worker threads that run the kernels' tasks, so one ctypes call (which releases the GIL) keeps
// every core busy with no Python between the parts of a layer.
//
// ie_parallel(tasks, threads, fn, arg) publishes one job (fn, arg, tasks) by bumping a generation counter; the
// caller and threads - 1 workers take task numbers from one atomic counter until none are left (tasks of uneven
// cost balance themselves, and a core another process holds simply takes fewer), then the caller waits for the
// workers to check out. A network runs ~100 such jobs back to back with a few microseconds of Python between them,
// so a worker spins for SPIN_NS after its last job before it sleeps on a condition variable: the next job then
// starts without a wake-up system call. Jobs of concurrent callers (two backends on two Python threads) run one
// after the other (run_lock). After fork() the child has no workers: the pool starts empty there.
#include "ie_cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define MAX_WORKERS 255
#define SPIN_NS 200000  // 0.2 ms: longer than the Python between two layers, short against a pause between forwards

static struct {
    pthread_mutex_t run_lock;  // one job at a time
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    int workers;               // started so far
    unsigned start_generation; // the generation before the job a new worker is started for
    atomic_uint generation;    // bumped once per job
    void (*fn)(void *, int);
    void *arg;
    int tasks, active;         // workers with index < active take tasks in this job
    atomic_int next_task;
    atomic_int checked_out;    // workers done with this job
} pool = {.run_lock = PTHREAD_MUTEX_INITIALIZER, .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
        .wake = PTHREAD_COND_INITIALIZER};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void take_tasks(void) {
    for (int t; (t = atomic_fetch_add(&pool.next_task, 1)) < pool.tasks;) pool.fn(pool.arg, t);
}

static void *worker(void *index_ptr) {
    int index = (int)(intptr_t)index_ptr;
    unsigned seen = pool.start_generation;  // so a worker that starts late still sees its first job as new
    for (;;) {
        int64_t spin_until = now_ns() + SPIN_NS;
        for (int i = 0; atomic_load(&pool.generation) == seen; i++) {
            __builtin_ia32_pause();
            if ((i & 63) == 63 && now_ns() > spin_until) {
                pthread_mutex_lock(&pool.sleep_lock);
                while (atomic_load(&pool.generation) == seen) pthread_cond_wait(&pool.wake, &pool.sleep_lock);
                pthread_mutex_unlock(&pool.sleep_lock);
            }
        }
        seen = atomic_load(&pool.generation);
        if (index < pool.active) take_tasks();
        atomic_fetch_add(&pool.checked_out, 1);
    }
    return NULL;
}

static void start_workers(int wanted) {
    pool.start_generation = atomic_load(&pool.generation);
    for (; pool.workers < wanted && pool.workers < MAX_WORKERS; pool.workers++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, worker, (void *)(intptr_t)pool.workers);
        pthread_attr_destroy(&attr);
        if (failed) break;  // run with the workers there are
    }
}

static void forget_workers_after_fork(void) {
    pthread_mutex_init(&pool.run_lock, NULL);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.workers = 0;
}

__attribute__((constructor)) static void on_load(void) { pthread_atfork(NULL, NULL, forget_workers_after_fork); }

void ie_parallel(int tasks, int threads, void (*fn)(void *arg, int task), void *arg) {
    if (threads > tasks) threads = tasks;
    if (threads <= 1) {
        for (int t = 0; t < tasks; t++) fn(arg, t);
        return;
    }
    pthread_mutex_lock(&pool.run_lock);
    start_workers(threads - 1);
    pool.fn = fn;
    pool.arg = arg;
    pool.tasks = tasks;
    pool.active = threads - 1;
    atomic_store(&pool.next_task, 0);
    atomic_store(&pool.checked_out, 0);
    atomic_fetch_add(&pool.generation, 1);  // publishes the fields above (sequentially consistent)
    pthread_mutex_lock(&pool.sleep_lock);   // a worker between its check and its wait holds this lock
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.sleep_lock);
    take_tasks();
    for (int i = 0; atomic_load(&pool.checked_out) < pool.workers; i++) {
        if (i < 4096) __builtin_ia32_pause();
        else sched_yield();  // a worker is off its core: let it have ours
    }
    pthread_mutex_unlock(&pool.run_lock);
}
