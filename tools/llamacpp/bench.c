// bench.c drives llama.cpp (the prebuilt libllama inside node-llama-cpp's
// npm packages, CPU only) through its C API for tools/llamacompare, the way
// llama-bench times it: llama_decode of a prompt, then of one token at a
// time, greedy on the logits in C, with no per-token overhead of a binding.
// It also measures the machine's read bandwidth, the floor a memory-bound
// decode step is held against. scripts/llamacpp-compare.sh builds it.
//
// One command per line on stdin, one answer line on stdout ("error <why>"
// on failure), so that the Go side can interleave it with ddflash's runs:
//
//   load <gguf> <threads> <context> <batch>   -> ok <vocab>
//   prefill <n> <token>...                    -> <ms>
//   generate <n> <prompt length> <token>...   -> <prefill ms> <decode ms> <token>... (n tokens)
//   bandwidth <MiB> <threads>                 -> <GB/s> <streams> (the best pass of 1, 2, 4 and 8 streams per thread)
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "ggml-backend.h"
#include "llama.h"

static struct llama_model *model;
static struct llama_context *ctx;
static int n_vocab;

static double now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
	(void)user;
	if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

// read_tokens reads n token ids from the rest of the command line.
static int read_tokens(char **rest, llama_token *out, int n) {
	for (int i = 0; i < n; i++) {
		char *end;
		long t = strtol(*rest, &end, 10);
		if (end == *rest) return -1;
		out[i] = (llama_token)t;
		*rest = end;
	}
	return 0;
}

static int cmd_load(char *args) {
	char path[4096];
	int threads, context, batch;
	if (sscanf(args, "%4095s %d %d %d", path, &threads, &context, &batch) != 4) return -1;
	if (ctx) llama_free(ctx);
	if (model) llama_model_free(model);
	struct llama_model_params mp = llama_model_default_params();
	mp.n_gpu_layers = 0;
	model = llama_model_load_from_file(path, mp);
	if (!model) return -1;
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = context;
	cp.n_batch = batch;
	cp.n_ubatch = batch;
	cp.n_seq_max = 1;
	cp.n_threads = threads;
	cp.n_threads_batch = threads;
	ctx = llama_init_from_model(model, cp);
	if (!ctx) return -1;
	n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
	printf("ok %d\n", n_vocab);
	return 0;
}

// eval decodes tokens from position 0 of a cleared sequence, n_batch at a
// time, and returns the greedy next token (or -1).
static llama_token eval(llama_token *tokens, int n) {
	int batch = (int)llama_n_batch(ctx);
	for (int i = 0; i < n; i += batch) {
		int m = n - i < batch ? n - i : batch;
		if (llama_decode(ctx, llama_batch_get_one(tokens + i, m)) != 0) return -1;
	}
	const float *logits = llama_get_logits_ith(ctx, -1);
	llama_token best = 0;
	for (int v = 1; v < n_vocab; v++)
		if (logits[v] > logits[best]) best = v;
	return best;
}

static int cmd_prefill(char *args, llama_token *buf, int cap) {
	char *rest = args;
	int n = (int)strtol(rest, &rest, 10);
	if (n <= 0 || n > cap || read_tokens(&rest, buf, n)) return -1;
	llama_memory_clear(llama_get_memory(ctx), true);
	double t0 = now_ms();
	if (eval(buf, n) < 0) return -1;
	printf("%.3f\n", now_ms() - t0);
	return 0;
}

static int cmd_generate(char *args, llama_token *buf, int cap) {
	char *rest = args;
	int n = (int)strtol(rest, &rest, 10), p = (int)strtol(rest, &rest, 10);
	if (n <= 0 || p <= 0 || n > cap || p > cap || read_tokens(&rest, buf, p)) return -1;
	llama_token *out = malloc(n * sizeof *out);
	llama_memory_clear(llama_get_memory(ctx), true);
	double t0 = now_ms();
	out[0] = eval(buf, p);
	double t1 = now_ms();
	for (int i = 1; i < n && out[i - 1] >= 0; i++) out[i] = eval(&out[i - 1], 1);
	double t2 = now_ms();
	int failed = out[n - 1] < 0;
	if (!failed) {
		printf("%.3f %.3f", t1 - t0, t2 - t1);
		for (int i = 0; i < n; i++) printf(" %d", out[i]);
		printf("\n");
	}
	free(out);
	return failed ? -1 : 0;
}

// The bandwidth probe: each thread sums its own share of the buffer (which
// it wrote first, so its pages are local), as 64-bit integers the compiler
// vectorises; the sums are stored where other threads can see them, so
// the reads cannot be dropped. A decode step reads its weights faster
// than one sequential stream per thread does on some machines (a 2-core
// VM gave 34 GB/s to the plain sum while a decode step read 43), so the
// buffer sits on transparent huge pages (no TLB walks) and each thread's
// share is read as 1, 2, 4 or 8 interleaved streams (more lines in
// flight); the probe is the best of them, the ceiling a step is held to.
struct probe {
	const uint64_t *words;
	size_t n;
	int streams;
	uint64_t sum;
};

static void *probe_sum(void *arg) {
	struct probe *p = arg;
	size_t len = p->n / p->streams & ~(size_t)7; // words per stream
	uint64_t s[8][4] = {{0}};
	for (size_t i = 0; i < len; i += 4) {
		for (int k = 0; k < p->streams; k++) {
			const uint64_t *w = p->words + k * len + i;
			s[k][0] += w[0];
			s[k][1] += w[1];
			s[k][2] += w[2];
			s[k][3] += w[3];
		}
	}
	for (int k = 0; k < p->streams; k++) p->sum += s[k][0] + s[k][1] + s[k][2] + s[k][3];
	return NULL;
}

static void *probe_fill(void *arg) {
	struct probe *p = arg;
	memset((void *)p->words, 1, p->n * sizeof *p->words);
	return NULL;
}

static void run_threads(struct probe *ps, int threads, void *(*fn)(void *)) {
	pthread_t tid[64];
	for (int t = 1; t < threads; t++) pthread_create(&tid[t], NULL, fn, &ps[t]);
	fn(&ps[0]);
	for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
}

// cmd_bandwidth prints the best read bandwidth over 8 passes of each
// stream count, and the stream count that gave it.
static int cmd_bandwidth(char *args) {
	long mib;
	int threads;
	if (sscanf(args, "%ld %d", &mib, &threads) != 2 || mib <= 0 || threads <= 0 || threads > 64) return -1;
	size_t bytes = (size_t)mib << 20, words = bytes / 8;
	const size_t huge = 2 << 20;
	uint64_t *buf = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
	if (!buf) return -1;
	madvise(buf, bytes, MADV_HUGEPAGE); // advice: where THP is off it does nothing
	struct probe ps[64];
	for (int t = 0; t < threads; t++) {
		size_t lo = words * t / threads, hi = words * (t + 1) / threads;
		ps[t] = (struct probe){buf + lo, hi - lo, 1, 0};
	}
	run_threads(ps, threads, probe_fill);
	double best = 0;
	int best_streams = 0;
	for (int streams = 1; streams <= 8; streams *= 2) {
		size_t read = 0; // the words the streams cover (each a multiple of 8)
		for (int t = 0; t < threads; t++) {
			ps[t].streams = streams;
			read += (ps[t].n / streams & ~(size_t)7) * streams;
		}
		for (int pass = 0; pass < 8; pass++) {
			double t0 = now_ms();
			run_threads(ps, threads, probe_sum);
			double gbs = read * 8 / (now_ms() - t0) / 1e6;
			if (gbs > best) best = gbs, best_streams = streams;
		}
	}
	free(buf);
	printf("%.2f %d\n", best, best_streams);
	return 0;
}

// print_cpu_features names, on stderr, the features of the CPU backend
// variant ggml chose (the libggml-cpu-*.so that scored best on this CPU).
static void print_cpu_features(void) {
	ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
	if (!reg) return;
	ggml_backend_get_features_t get = (ggml_backend_get_features_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
	if (!get) return;
	fputs("llama.cpp CPU backend:", stderr);
	for (struct ggml_backend_feature *f = get(reg); f && f->name; f++) fprintf(stderr, " %s=%s", f->name, f->value);
	fputs("\n", stderr);
}

int main(void) {
	llama_log_set(quiet_log, NULL);
	ggml_log_set(quiet_log, NULL);
	const char *dir = getenv("LLAMA_BACKEND_DIR");
	if (dir) ggml_backend_load_all_from_path(dir);
	else ggml_backend_load_all();
	llama_backend_init();
	print_cpu_features();
	enum { max_tokens = 1 << 16 };
	llama_token *tokens = malloc(max_tokens * sizeof *tokens);
	size_t cap = 1 << 20;
	char *line = malloc(cap);
	ssize_t len;
	while ((len = getline(&line, &cap, stdin)) > 0) {
		char cmd[16];
		int used = 0;
		if (sscanf(line, "%15s %n", cmd, &used) != 1) continue;
		char *args = line + used;
		int err;
		if (!strcmp(cmd, "load")) err = cmd_load(args);
		else if (!ctx && strcmp(cmd, "bandwidth")) err = -1;
		else if (!strcmp(cmd, "prefill")) err = cmd_prefill(args, tokens, max_tokens);
		else if (!strcmp(cmd, "generate")) err = cmd_generate(args, tokens, max_tokens);
		else if (!strcmp(cmd, "bandwidth")) err = cmd_bandwidth(args);
		else err = -1;
		if (err) printf("error %s failed: %s", cmd, line);
		fflush(stdout);
	}
	if (ctx) llama_free(ctx);
	if (model) llama_model_free(model);
	llama_backend_free();
	return 0;
}
