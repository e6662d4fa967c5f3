/*
 * A stand-in for the part of SPDK that weir calls, over RAM: for testing
 * weir's glue (its FFI declarations, the C glue, the polling threads, the
 * memory it hands over, the status codes it decodes), not SPDK.
 *
 * It keeps the rules SPDK sets its callers and counts every breach as a
 * violation, which the tests assert stays at zero:
 * - the environment is initialised once, before any other call;
 * - I/O memory is DMA memory from spdk_zmalloc, dword aligned; a scattered
 *   payload follows the PRP rules (every segment but the first starts on a
 *   4 KiB page, every segment but the last ends on one);
 * - a queue pair is used by one thread only, and freed before its controller
 *   is detached;
 * - Write Zeroes covers 1 to 65,536 blocks (NVMe's 16-bit count), and takes
 *   the Deallocate bit only where the namespace says it may (DLFEAT);
 * - the only other I/O flag is FUA, on writes;
 * - a namespace with metadata gets metadata with every transfer.
 * A command completes only in a later spdk_nvme_qpair_process_completions,
 * newest first, so completions come out of order; data moves at completion,
 * as a device's DMA would. Initialising the environment pins the calling
 * thread to core 0, as DPDK does. Freeing a queue pair completes what it holds
 * with "aborted: SQ deletion", as SPDK does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mock_internal.h"


pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
int g_env;
struct spdk_nvme_ctrlr g_ctrlrs[MOCK_CTRLRS];
int g_nctrlrs;
static struct {
	uintptr_t addr;
	size_t len;
} g_dma[MOCK_DMA];
static int g_ndma;
static uint64_t g_violations;
static char g_last[256];

void violation(const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&g_lock);
	g_violations++;
	va_start(ap, fmt);
	vsnprintf(g_last, sizeof(g_last), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&g_lock);
}

/* ---- the stand-in's own controls, for the tests ---- */

int weir_spdk_mock_add_ctrlr(const char *traddr, uint32_t sector_size, uint64_t sectors,
			     uint32_t max_xfer, uint32_t flags, int wz_deallocate,
			     uint32_t qpair_requests)
{
	struct spdk_nvme_ctrlr *c;

	pthread_mutex_lock(&g_lock);
	if (g_nctrlrs == MOCK_CTRLRS) {
		pthread_mutex_unlock(&g_lock);
		return -ENOSPC;
	}
	c = &g_ctrlrs[g_nctrlrs];
	memset(c, 0, sizeof(*c));
	snprintf(c->traddr, sizeof(c->traddr), "%s", traddr);
	/* A serial as a drive reports it: ASCII, space padded to 20 bytes. */
	memset(c->data.sn, ' ', sizeof(c->data.sn));
	memcpy(c->data.sn, "MOCK-", 5);
	for (size_t i = 0; i < 8 && traddr[i] != '\0'; i++) {
		c->data.sn[5 + i] = traddr[i];
	}
	c->ns.ctrlr = c;
	c->ns.sector_size = sector_size;
	c->ns.sectors = sectors;
	c->ns.max_xfer = max_xfer;
	c->ns.flags = flags;
	c->ns.data.dlfeat.bits.write_zero_deallocate = wz_deallocate ? 1 : 0;
	/* Namespace ids as a drive reports them: from the address, and new
	 * whenever the namespace is made again (weir_spdk_mock_remake_ns). */
	for (size_t i = 0; i < sizeof(c->ns.data.nguid); i++) {
		c->ns.data.nguid[i] = (uint8_t)(traddr[i % strlen(traddr)] + i);
	}
	c->ns.data.eui64 = 0x0025380000000000ull + (uint64_t)g_nctrlrs;
	memset(c->data.mn, ' ', sizeof(c->data.mn));
	memcpy(c->data.mn, "weir stand-in", 13);
	c->ns.media = calloc(sectors, sector_size);
	c->qpair_requests = qpair_requests;
	if (c->ns.media == NULL) {
		pthread_mutex_unlock(&g_lock);
		return -ENOMEM;
	}
	g_nctrlrs++;
	pthread_mutex_unlock(&g_lock);
	return 0;
}

struct spdk_nvme_ctrlr *find(const char *traddr)
{
	for (int i = 0; i < g_nctrlrs; i++) {
		if (strcmp(g_ctrlrs[i].traddr, traddr) == 0) {
			return &g_ctrlrs[i];
		}
	}
	return NULL;
}

void weir_spdk_mock_fail_next(const char *traddr, uint8_t sct, uint8_t sc)
{
	pthread_mutex_lock(&g_lock);
	struct spdk_nvme_ctrlr *c = find(traddr);
	if (c != NULL) {
		c->fail_next = 1;
		c->fail_sct = sct;
		c->fail_sc = sc;
	}
	pthread_mutex_unlock(&g_lock);
}

void weir_spdk_mock_hold(const char *traddr, int hold)
{
	pthread_mutex_lock(&g_lock);
	struct spdk_nvme_ctrlr *c = find(traddr);
	if (c != NULL) {
		c->hold = hold;
	}
	pthread_mutex_unlock(&g_lock);
}

/* Give the namespace metadata of md_size bytes per sector (0: none). */
void weir_spdk_mock_set_md(const char *traddr, uint32_t md_size)
{
	pthread_mutex_lock(&g_lock);
	struct spdk_nvme_ctrlr *c = find(traddr);
	if (c != NULL) {
		c->ns.md_size = md_size;
	}
	pthread_mutex_unlock(&g_lock);
}

/* Delete the namespace and make it again: new NGUID and EUI-64. */
void weir_spdk_mock_remake_ns(const char *traddr)
{
	pthread_mutex_lock(&g_lock);
	struct spdk_nvme_ctrlr *c = find(traddr);
	if (c != NULL) {
		c->ns.data.nguid[0]++;
		c->ns.data.eui64 += 0x100;
	}
	pthread_mutex_unlock(&g_lock);
}

void weir_spdk_mock_fail_ctrlr(const char *traddr)
{
	pthread_mutex_lock(&g_lock);
	struct spdk_nvme_ctrlr *c = find(traddr);
	if (c != NULL) {
		c->failed = 1;
	}
	pthread_mutex_unlock(&g_lock);
}

/* Counters: 0 reads, 1 writes, 2 FUA writes, 3 flushes, 4 Write Zeroes,
 * 5 of them with Deallocate, 6 scattered writes, 7 most commands held at
 * once, 8 admin queue polls. */
uint64_t weir_spdk_mock_count(const char *traddr, int what)
{
	uint64_t v = 0;

	pthread_mutex_lock(&g_lock);
	struct spdk_nvme_ctrlr *c = find(traddr);
	if (c != NULL && what >= 0 && what < MOCK_COUNTS) {
		v = c->counts[what];
	}
	pthread_mutex_unlock(&g_lock);
	return v;
}

/* Copy media bytes out, as if read straight off the flash. */
int weir_spdk_mock_peek(const char *traddr, uint64_t offset, void *out, size_t len)
{
	int rc = -EINVAL;

	pthread_mutex_lock(&g_lock);
	struct spdk_nvme_ctrlr *c = find(traddr);
	if (c != NULL && offset + len <= c->ns.sectors * c->ns.sector_size) {
		memcpy(out, c->ns.media + offset, len);
		rc = 0;
	}
	pthread_mutex_unlock(&g_lock);
	return rc;
}

uint64_t weir_spdk_mock_violations(char *last, size_t cap)
{
	uint64_t v;

	pthread_mutex_lock(&g_lock);
	v = g_violations;
	if (last != NULL && cap > 0) {
		snprintf(last, cap, "%s", g_last);
	}
	pthread_mutex_unlock(&g_lock);
	return v;
}

/* DMA allocations live now. */
int weir_spdk_mock_dma_live(void)
{
	int n;

	pthread_mutex_lock(&g_lock);
	n = g_ndma;
	pthread_mutex_unlock(&g_lock);
	return n;
}

/* ---- environment and DMA memory ---- */

void spdk_env_opts_init(struct spdk_env_opts *opts)
{
	size_t size = opts->opts_size;

	if (size != sizeof(*opts)) {
		violation("spdk_env_opts_init: opts_size not set before the call");
	}
	memset(opts, 0, sizeof(*opts));
	opts->opts_size = size;
	opts->name = "spdk";
	opts->core_mask = "0x1";
}

int spdk_env_init(const struct spdk_env_opts *opts)
{
	int rc = 0;

	if (opts->name == NULL || opts->opts_size != sizeof(*opts)) {
		violation("spdk_env_init: options not from spdk_env_opts_init");
		return -EINVAL;
	}
	if (opts->no_huge && opts->mem_size <= 0) {
		/* SPDK refuses no_huge without a memory size. */
		return -EINVAL;
	}
	pthread_mutex_lock(&g_lock);
	if (g_env) {
		rc = -EALREADY;
	}
	g_env = 1;
	pthread_mutex_unlock(&g_lock);
	if (rc != 0) {
		violation("spdk_env_init called twice");
		return rc;
	}
	/* As DPDK does: the initialising thread is pinned to the main core. */
	cpu_set_t main_core;
	CPU_ZERO(&main_core);
	CPU_SET(0, &main_core);
	(void)sched_setaffinity(0, sizeof(main_core), &main_core);
	return 0;
}

void *spdk_zmalloc(size_t size, size_t align, uint64_t *unused, int numa_id, uint32_t flags)
{
	void *p = NULL;

	(void)numa_id;
	if (unused != NULL || !(flags & SPDK_MALLOC_DMA) || size == 0) {
		violation("spdk_zmalloc: bad arguments");
		return NULL;
	}
	if (align < 64) {
		align = 64;
	}
	pthread_mutex_lock(&g_lock);
	if (!g_env) {
		pthread_mutex_unlock(&g_lock);
		violation("spdk_zmalloc before spdk_env_init");
		return NULL;
	}
	if (g_ndma < MOCK_DMA && posix_memalign(&p, align, size) == 0) {
		memset(p, 0, size);
		g_dma[g_ndma].addr = (uintptr_t)p;
		g_dma[g_ndma].len = size;
		g_ndma++;
	}
	pthread_mutex_unlock(&g_lock);
	return p;
}

void spdk_free(void *buf)
{
	int found = 0;

	if (buf == NULL) {
		return;
	}
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < g_ndma; i++) {
		if (g_dma[i].addr == (uintptr_t)buf) {
			g_dma[i] = g_dma[--g_ndma];
			found = 1;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
	if (found) {
		free(buf);
	} else {
		violation("spdk_free of memory not from spdk_zmalloc");
	}
}

int is_dma(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p;
	int ok = 0;

	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < g_ndma; i++) {
		if (a >= g_dma[i].addr && a + len <= g_dma[i].addr + g_dma[i].len) {
			ok = 1;
			break;
		}
	}
	pthread_mutex_unlock(&g_lock);
	return ok;
}

