/*
 * The stand-in's own declarations, shared by its two files (spdk_mock.c:
 * controls, environment, DMA memory; spdk_mock_nvme.c: controllers, queue
 * pairs, commands).
 */
#ifndef WEIR_MOCK_INTERNAL_H
#define WEIR_MOCK_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "spdk/env.h"
#include "spdk/nvme.h"

#define MOCK_CTRLRS 16
#define MOCK_DMA 4096
#define MOCK_SGES 64
#define PAGE 4096u

enum mock_op { OP_READ, OP_WRITE, OP_FLUSH, OP_ZEROES };

/* Write Zeroes' Deallocate bit (cdw12 bit 25), as SPDK passes io_flags. */
#define MOCK_IO_FLAGS_DEAC (1U << 25)
#define MOCK_COUNTS 9

struct mock_req {
	enum mock_op op;
	uint64_t lba;
	uint32_t count;
	uint32_t nsge;
	void *addr[MOCK_SGES];
	uint32_t len[MOCK_SGES];
	spdk_nvme_cmd_cb cb;
	void *cb_arg;
};

struct spdk_nvme_ns {
	struct spdk_nvme_ctrlr *ctrlr;
	uint32_t sector_size;
	uint64_t sectors;
	uint32_t max_xfer;
	uint32_t flags;
	/* Metadata bytes per sector (0: none). */
	uint32_t md_size;
	struct spdk_nvme_ns_data data;
	uint8_t *media;
};

struct spdk_nvme_ctrlr {
	char traddr[257];
	struct spdk_nvme_ctrlr_data data;
	struct spdk_nvme_ns ns;
	int attached;
	int failed;
	/* Completions are held back (nothing completes) while set. */
	int hold;
	int qpairs;
	uint32_t qpair_requests;
	/* A status the next completed I/O command gets instead of success. */
	int fail_next;
	uint8_t fail_sct, fail_sc;
	uint64_t counts[MOCK_COUNTS];
};

struct spdk_nvme_qpair {
	struct spdk_nvme_ctrlr *ctrlr;
	pthread_t owner;
	int owned;
	uint32_t cap;
	uint32_t n;
	struct mock_req *reqs;
};

/* Guards everything below and every controller's fields but a queue pair's
 * requests (which only its owning thread touches). */
extern pthread_mutex_t g_lock;
extern struct spdk_nvme_ctrlr g_ctrlrs[MOCK_CTRLRS];
extern int g_nctrlrs;
extern int g_env;

/* Count a breach of SPDK's rules (takes g_lock: call without it). */
void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The controller at traddr, or NULL; call with g_lock held. */
struct spdk_nvme_ctrlr *find(const char *traddr);
/* [p, p + len) lies in one DMA allocation; takes g_lock. */
int is_dma(const void *p, size_t len);

#endif
