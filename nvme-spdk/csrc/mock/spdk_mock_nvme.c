/*
 * The stand-in's controllers, namespaces, queue pairs and commands (see
 * spdk_mock.c for what it is and the rules it checks).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mock_internal.h"

/* ---- controllers and namespaces ---- */

int spdk_nvme_transport_id_parse(struct spdk_nvme_transport_id *trid, const char *str)
{
	const char *tr = strstr(str, "trtype:");
	const char *addr = strstr(str, "traddr:");
	size_t n;

	if (tr == NULL || addr == NULL) {
		return -EINVAL;
	}
	addr += strlen("traddr:");
	n = strcspn(addr, " \t\n");
	if (n == 0 || n >= sizeof(trid->traddr)) {
		return -EINVAL;
	}
	memcpy(trid->traddr, addr, n);
	trid->traddr[n] = '\0';
	tr += strlen("trtype:");
	n = strcspn(tr, " \t\n");
	if (n == 0 || n >= sizeof(trid->trstring)) {
		return -EINVAL;
	}
	memcpy(trid->trstring, tr, n);
	trid->trstring[n] = '\0';
	return 0;
}

struct spdk_nvme_ctrlr *spdk_nvme_connect(const struct spdk_nvme_transport_id *trid,
		const struct spdk_nvme_ctrlr_opts *opts, size_t opts_size)
{
	struct spdk_nvme_ctrlr *c;

	if (opts != NULL || opts_size != 0) {
		violation("spdk_nvme_connect: weir passes no controller options");
	}
	pthread_mutex_lock(&g_lock);
	if (!g_env) {
		pthread_mutex_unlock(&g_lock);
		violation("spdk_nvme_connect before spdk_env_init");
		return NULL;
	}
	c = find(trid->traddr);
	if (c != NULL && c->attached) {
		c = NULL; /* one process attaches a controller once */
	}
	if (c != NULL) {
		c->attached = 1;
	}
	pthread_mutex_unlock(&g_lock);
	return c;
}

int spdk_nvme_detach(struct spdk_nvme_ctrlr *ctrlr)
{
	pthread_mutex_lock(&g_lock);
	int qpairs = ctrlr->qpairs;
	ctrlr->attached = 0;
	pthread_mutex_unlock(&g_lock);
	if (qpairs != 0) {
		violation("spdk_nvme_detach with %d queue pairs still allocated", qpairs);
	}
	return 0;
}

const struct spdk_nvme_ctrlr_data *spdk_nvme_ctrlr_get_data(struct spdk_nvme_ctrlr *ctrlr)
{
	return &ctrlr->data;
}

struct spdk_nvme_ns *spdk_nvme_ctrlr_get_ns(struct spdk_nvme_ctrlr *ctrlr, uint32_t ns_id)
{
	return ns_id == 1 ? &ctrlr->ns : NULL;
}

uint32_t spdk_nvme_ns_get_md_size(struct spdk_nvme_ns *ns)
{
	return ns->md_size;
}

uint32_t spdk_nvme_ns_get_extended_sector_size(struct spdk_nvme_ns *ns)
{
	return ns->sector_size + ns->md_size;
}

int spdk_nvme_ns_get_pi_type(struct spdk_nvme_ns *ns)
{
	(void)ns;
	return 0;
}

int32_t spdk_nvme_ctrlr_process_admin_completions(struct spdk_nvme_ctrlr *ctrlr)
{
	pthread_mutex_lock(&g_lock);
	ctrlr->counts[8]++;
	int failed = ctrlr->failed;
	pthread_mutex_unlock(&g_lock);
	return failed ? -ENXIO : 0;
}

bool spdk_nvme_ns_is_active(struct spdk_nvme_ns *ns)
{
	return ns->sectors > 0;
}

uint32_t spdk_nvme_ns_get_sector_size(struct spdk_nvme_ns *ns)
{
	return ns->sector_size;
}

uint64_t spdk_nvme_ns_get_num_sectors(struct spdk_nvme_ns *ns)
{
	return ns->sectors;
}

uint32_t spdk_nvme_ns_get_max_io_xfer_size(struct spdk_nvme_ns *ns)
{
	return ns->max_xfer;
}

uint32_t spdk_nvme_ns_get_optimal_io_boundary(struct spdk_nvme_ns *ns)
{
	(void)ns;
	return 0;
}

uint32_t spdk_nvme_ns_get_flags(struct spdk_nvme_ns *ns)
{
	return ns->flags;
}

const struct spdk_nvme_ns_data *spdk_nvme_ns_get_data(struct spdk_nvme_ns *ns)
{
	return &ns->data;
}

/* ---- queue pairs ---- */

struct spdk_nvme_qpair *spdk_nvme_ctrlr_alloc_io_qpair(struct spdk_nvme_ctrlr *ctrlr,
		const struct spdk_nvme_io_qpair_opts *opts, size_t opts_size)
{
	struct spdk_nvme_qpair *q;

	if (opts != NULL || opts_size != 0) {
		violation("spdk_nvme_ctrlr_alloc_io_qpair: weir passes no qpair options");
	}
	q = calloc(1, sizeof(*q));
	if (q == NULL) {
		return NULL;
	}
	q->ctrlr = ctrlr;
	q->cap = ctrlr->qpair_requests;
	q->reqs = calloc(q->cap, sizeof(*q->reqs));
	if (q->reqs == NULL) {
		free(q);
		return NULL;
	}
	pthread_mutex_lock(&g_lock);
	ctrlr->qpairs++;
	pthread_mutex_unlock(&g_lock);
	return q;
}

/* One thread per queue pair: the first to use it owns it. */
static int check_owner(struct spdk_nvme_qpair *q, const char *what)
{
	if (!q->owned) {
		q->owner = pthread_self();
		q->owned = 1;
	} else if (!pthread_equal(q->owner, pthread_self())) {
		violation("%s: queue pair used from a second thread", what);
		return -EINVAL;
	}
	return 0;
}

static void complete(struct spdk_nvme_qpair *q, const struct mock_req *r, uint8_t sct, uint8_t sc)
{
	struct spdk_nvme_cpl cpl;

	(void)q;
	memset(&cpl, 0, sizeof(cpl));
	cpl.status.sct = sct;
	cpl.status.sc = sc;
	cpl.status.dnr = sct != 0 || sc != 0;
	r->cb(r->cb_arg, &cpl);
}

/* Carry a command out against the media; returns the status code (generic). */
static uint8_t execute(struct spdk_nvme_ns *ns, const struct mock_req *r)
{
	uint64_t ss = ns->sector_size;

	switch (r->op) {
	case OP_READ:
	case OP_WRITE: {
		if (r->lba + r->count > ns->sectors) {
			return 0x80; /* LBA out of range */
		}
		uint8_t *at = ns->media + r->lba * ss;
		for (uint32_t i = 0; i < r->nsge; i++) {
			if (r->op == OP_READ) {
				memcpy(r->addr[i], at, r->len[i]);
			} else {
				memcpy(at, r->addr[i], r->len[i]);
			}
			at += r->len[i];
		}
		return 0;
	}
	case OP_FLUSH:
		return 0;
	case OP_ZEROES:
		if (r->lba + r->count > ns->sectors) {
			return 0x80;
		}
		memset(ns->media + r->lba * ss, 0, (size_t)r->count * ss);
		return 0;
	}
	return 0x06;
}

/* Queue `r`: the common checks of every submission. */
static int enqueue(struct spdk_nvme_qpair *q, const struct mock_req *r, const char *what)
{
	int rc = check_owner(q, what);

	if (rc != 0) {
		return rc;
	}
	pthread_mutex_lock(&g_lock);
	int failed = q->ctrlr->failed;
	pthread_mutex_unlock(&g_lock);
	if (failed) {
		return -ENXIO;
	}
	if (q->n == q->cap) {
		return -ENOMEM;
	}
	q->reqs[q->n++] = *r;
	pthread_mutex_lock(&g_lock);
	q->ctrlr->counts[r->op == OP_READ ? 0 : r->op == OP_WRITE ? 1 : r->op == OP_FLUSH ? 3 : 4]++;
	if (q->n > q->ctrlr->counts[7]) {
		q->ctrlr->counts[7] = q->n;
	}
	pthread_mutex_unlock(&g_lock);
	return 0;
}

static int check_io_flags(uint32_t io_flags, const char *what)
{
	if (io_flags & ~SPDK_NVME_IO_FLAGS_FORCE_UNIT_ACCESS) {
		violation("%s: unknown I/O flags 0x%x", what, io_flags);
		return -EINVAL;
	}
	return 0;
}

static int transfer(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair, void *payload,
		    uint64_t lba, uint32_t lba_count, spdk_nvme_cmd_cb cb_fn, void *cb_arg,
		    uint32_t io_flags, enum mock_op op, const char *what)
{
	struct mock_req r;
	/* With metadata interleaved, every sector carries it too. */
	size_t len = (size_t)lba_count * (ns->sector_size + ns->md_size);

	if (check_io_flags(io_flags, what) != 0 || lba_count == 0) {
		return -EINVAL;
	}
	if (!is_dma(payload, len) || ((uintptr_t)payload & 3) != 0) {
		violation("%s: payload %p (%zu bytes) is not dword-aligned DMA memory", what, payload,
			  len);
		return -EINVAL;
	}
	memset(&r, 0, sizeof(r));
	r.op = op;
	r.lba = lba;
	r.count = lba_count;
	r.nsge = 1;
	r.addr[0] = payload;
	r.len[0] = (uint32_t)len;
	r.cb = cb_fn;
	r.cb_arg = cb_arg;
	int rc = enqueue(qpair, &r, what);
	if (rc == 0 && op == OP_WRITE && (io_flags & SPDK_NVME_IO_FLAGS_FORCE_UNIT_ACCESS)) {
		pthread_mutex_lock(&g_lock);
		ns->ctrlr->counts[2]++;
		pthread_mutex_unlock(&g_lock);
	}
	return rc;
}

int spdk_nvme_ns_cmd_read(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair, void *payload,
			  uint64_t lba, uint32_t lba_count, spdk_nvme_cmd_cb cb_fn,
			  void *cb_arg, uint32_t io_flags)
{
	return transfer(ns, qpair, payload, lba, lba_count, cb_fn, cb_arg, io_flags, OP_READ,
			"spdk_nvme_ns_cmd_read");
}

int spdk_nvme_ns_cmd_write(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair, void *payload,
			   uint64_t lba, uint32_t lba_count, spdk_nvme_cmd_cb cb_fn,
			   void *cb_arg, uint32_t io_flags)
{
	return transfer(ns, qpair, payload, lba, lba_count, cb_fn, cb_arg, io_flags, OP_WRITE,
			"spdk_nvme_ns_cmd_write");
}

int spdk_nvme_ns_cmd_writev(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair,
			    uint64_t lba, uint32_t lba_count,
			    spdk_nvme_cmd_cb cb_fn, void *cb_arg, uint32_t io_flags,
			    spdk_nvme_req_reset_sgl_cb reset_sgl_fn,
			    spdk_nvme_req_next_sge_cb next_sge_fn)
{
	const char *what = "spdk_nvme_ns_cmd_writev";
	struct mock_req r;
	size_t want = (size_t)lba_count * ns->sector_size, got = 0;

	if (check_io_flags(io_flags, what) != 0 || lba_count == 0) {
		return -EINVAL;
	}
	memset(&r, 0, sizeof(r));
	r.op = OP_WRITE;
	r.lba = lba;
	r.count = lba_count;
	r.cb = cb_fn;
	r.cb_arg = cb_arg;
	reset_sgl_fn(cb_arg, 0);
	while (got < want) {
		void *addr = NULL;
		uint32_t len = 0;
		if (r.nsge == MOCK_SGES || next_sge_fn(cb_arg, &addr, &len) != 0 || len == 0) {
			violation("%s: the SGL ended after %zu of %zu bytes", what, got, want);
			return -EINVAL;
		}
		if (len > want - got) {
			len = (uint32_t)(want - got);
		}
		if (!is_dma(addr, len) || ((uintptr_t)addr & 3) != 0) {
			violation("%s: segment %p (%u bytes) is not DMA memory", what, addr, len);
			return -EINVAL;
		}
		if (r.nsge > 0 && ((uintptr_t)addr % PAGE) != 0) {
			violation("%s: segment %u does not start on a page (PRP)", what, r.nsge);
			return -EINVAL;
		}
		if (got + len < want && (((uintptr_t)addr + len) % PAGE) != 0) {
			violation("%s: segment %u ends inside a page (PRP)", what, r.nsge);
			return -EINVAL;
		}
		r.addr[r.nsge] = addr;
		r.len[r.nsge] = len;
		r.nsge++;
		got += len;
	}
	/* SPDK walks again from an offset when it splits a request: from the
	 * second segment's start, the walk must give the second segment. */
	if (r.nsge > 1) {
		void *addr = NULL;
		uint32_t len = 0;
		reset_sgl_fn(cb_arg, r.len[0]);
		if (next_sge_fn(cb_arg, &addr, &len) != 0 || addr != r.addr[1] ||
		    len < r.len[1]) {
			violation("%s: the SGL walked from offset %u is not the second segment", what,
				  r.len[0]);
			return -EINVAL;
		}
	}
	int rc = enqueue(qpair, &r, what);
	if (rc == 0) {
		pthread_mutex_lock(&g_lock);
		ns->ctrlr->counts[6]++;
		if (io_flags & SPDK_NVME_IO_FLAGS_FORCE_UNIT_ACCESS) {
			ns->ctrlr->counts[2]++;
		}
		pthread_mutex_unlock(&g_lock);
	}
	return rc;
}

int spdk_nvme_ns_cmd_flush(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair,
			   spdk_nvme_cmd_cb cb_fn, void *cb_arg)
{
	struct mock_req r;

	(void)ns;
	memset(&r, 0, sizeof(r));
	r.op = OP_FLUSH;
	r.cb = cb_fn;
	r.cb_arg = cb_arg;
	return enqueue(qpair, &r, "spdk_nvme_ns_cmd_flush");
}

int spdk_nvme_ns_cmd_write_zeroes(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair,
				  uint64_t lba, uint32_t lba_count,
				  spdk_nvme_cmd_cb cb_fn, void *cb_arg, uint32_t io_flags)
{
	struct mock_req r;

	if (io_flags & ~MOCK_IO_FLAGS_DEAC) {
		violation("Write Zeroes: unknown I/O flags 0x%x", io_flags);
		return -EINVAL;
	}
	if ((io_flags & MOCK_IO_FLAGS_DEAC) && !ns->data.dlfeat.bits.write_zero_deallocate) {
		violation("Write Zeroes with Deallocate on a namespace without it (DLFEAT)");
		return -EINVAL;
	}
	if (!(ns->flags & SPDK_NVME_NS_WRITE_ZEROES_SUPPORTED)) {
		violation("Write Zeroes on a namespace without it");
		return -EINVAL;
	}
	if (lba_count == 0 || lba_count > 65536) {
		violation("Write Zeroes of %u blocks (NVMe: 1 to 65,536)", lba_count);
		return -EINVAL;
	}
	memset(&r, 0, sizeof(r));
	r.op = OP_ZEROES;
	r.lba = lba;
	r.count = lba_count;
	r.cb = cb_fn;
	r.cb_arg = cb_arg;
	int rc = enqueue(qpair, &r, "spdk_nvme_ns_cmd_write_zeroes");
	if (rc == 0 && (io_flags & MOCK_IO_FLAGS_DEAC)) {
		pthread_mutex_lock(&g_lock);
		ns->ctrlr->counts[5]++;
		pthread_mutex_unlock(&g_lock);
	}
	return rc;
}

int32_t spdk_nvme_qpair_process_completions(struct spdk_nvme_qpair *qpair,
		uint32_t max_completions)
{
	int32_t done = 0;

	if (check_owner(qpair, "spdk_nvme_qpair_process_completions") != 0) {
		return -EINVAL;
	}
	pthread_mutex_lock(&g_lock);
	int failed = qpair->ctrlr->failed, hold = qpair->ctrlr->hold;
	pthread_mutex_unlock(&g_lock);
	if (failed) {
		return -ENXIO;
	}
	if (hold) {
		return 0;
	}
	/* Newest first: completions come out of order. Only what was queued
	 * before this call completes in it. */
	uint32_t queued = qpair->n;
	while (queued > 0 && (max_completions == 0 || (uint32_t)done < max_completions)) {
		struct mock_req r = qpair->reqs[--queued];
		uint8_t sct = 0, sc;
		/* Remove it before the callback, which may submit again. */
		memmove(&qpair->reqs[queued], &qpair->reqs[queued + 1],
			(qpair->n - queued - 1) * sizeof(r));
		qpair->n--;
		pthread_mutex_lock(&g_lock);
		struct spdk_nvme_ctrlr *c = qpair->ctrlr;
		int fail = c->fail_next && r.op != OP_FLUSH;
		if (fail) {
			c->fail_next = 0;
			sct = c->fail_sct;
			sc = c->fail_sc;
		}
		pthread_mutex_unlock(&g_lock);
		if (!fail) {
			sc = execute(&c->ns, &r);
		}
		complete(qpair, &r, sct, sc);
		done++;
	}
	return done;
}

int spdk_nvme_ctrlr_free_io_qpair(struct spdk_nvme_qpair *qpair)
{
	if (check_owner(qpair, "spdk_nvme_ctrlr_free_io_qpair") != 0) {
		return -EINVAL;
	}
	while (qpair->n > 0) {
		struct mock_req r = qpair->reqs[--qpair->n];
		complete(qpair, &r, 0, 0x08); /* aborted: SQ deletion */
	}
	pthread_mutex_lock(&g_lock);
	qpair->ctrlr->qpairs--;
	pthread_mutex_unlock(&g_lock);
	free(qpair->reqs);
	free(qpair);
	return 0;
}
