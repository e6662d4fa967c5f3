/*
 * The stand-in's spdk/nvme.h: the part of SPDK's NVMe driver API that weir
 * uses, with SPDK's names and signatures. The completion entry, its status
 * and the dataset management range are laid out as the NVMe specification
 * (and SPDK's nvme_spec.h) lay them out; the namespace data holds only DLFEAT.
 */
#ifndef WEIR_MOCK_SPDK_NVME_H
#define WEIR_MOCK_SPDK_NVME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct spdk_nvme_ctrlr;
struct spdk_nvme_ns;
struct spdk_nvme_qpair;
struct spdk_nvme_ctrlr_opts;
struct spdk_nvme_io_qpair_opts;

struct spdk_nvme_transport_id {
	char trstring[33];
	char traddr[257];
};

struct spdk_nvme_status {
	uint16_t p : 1;
	uint16_t sc : 8;
	uint16_t sct : 3;
	uint16_t crd : 2;
	uint16_t m : 1;
	uint16_t dnr : 1;
};

struct spdk_nvme_cpl {
	uint32_t cdw0;
	uint32_t cdw1;
	uint16_t sqhd;
	uint16_t sqid;
	uint16_t cid;
	union {
		uint16_t status_raw;
		struct spdk_nvme_status status;
	};
};
_Static_assert(sizeof(struct spdk_nvme_cpl) == 16, "NVMe completion entry");

struct spdk_nvme_ns_data {
	uint8_t nguid[16];
	uint64_t eui64;
	union {
		uint8_t raw;
		struct {
			uint8_t read_value : 3;
			uint8_t write_zero_deallocate : 1;
			uint8_t guard_value : 1;
			uint8_t reserved : 3;
		} bits;
	} dlfeat;
};

struct spdk_nvme_ctrlr_data {
	int8_t sn[20];
	int8_t mn[40];
};

enum spdk_nvme_ns_flags {
	SPDK_NVME_NS_FLUSH_SUPPORTED = 1 << 1,
	SPDK_NVME_NS_WRITE_ZEROES_SUPPORTED = 1 << 3,
};

#define SPDK_NVME_IO_FLAGS_FORCE_UNIT_ACCESS (1U << 30)

typedef void (*spdk_nvme_cmd_cb)(void *ctx, const struct spdk_nvme_cpl *cpl);
typedef void (*spdk_nvme_req_reset_sgl_cb)(void *cb_arg, uint32_t offset);
typedef int (*spdk_nvme_req_next_sge_cb)(void *cb_arg, void **address, uint32_t *length);

int spdk_nvme_transport_id_parse(struct spdk_nvme_transport_id *trid, const char *str);
struct spdk_nvme_ctrlr *spdk_nvme_connect(const struct spdk_nvme_transport_id *trid,
		const struct spdk_nvme_ctrlr_opts *opts, size_t opts_size);
int spdk_nvme_detach(struct spdk_nvme_ctrlr *ctrlr);
const struct spdk_nvme_ctrlr_data *spdk_nvme_ctrlr_get_data(struct spdk_nvme_ctrlr *ctrlr);
struct spdk_nvme_ns *spdk_nvme_ctrlr_get_ns(struct spdk_nvme_ctrlr *ctrlr, uint32_t ns_id);
bool spdk_nvme_ns_is_active(struct spdk_nvme_ns *ns);
uint32_t spdk_nvme_ns_get_sector_size(struct spdk_nvme_ns *ns);
uint64_t spdk_nvme_ns_get_num_sectors(struct spdk_nvme_ns *ns);
uint32_t spdk_nvme_ns_get_max_io_xfer_size(struct spdk_nvme_ns *ns);
uint32_t spdk_nvme_ns_get_optimal_io_boundary(struct spdk_nvme_ns *ns);
uint32_t spdk_nvme_ns_get_flags(struct spdk_nvme_ns *ns);
uint32_t spdk_nvme_ns_get_md_size(struct spdk_nvme_ns *ns);
uint32_t spdk_nvme_ns_get_extended_sector_size(struct spdk_nvme_ns *ns);
int spdk_nvme_ns_get_pi_type(struct spdk_nvme_ns *ns);
int32_t spdk_nvme_ctrlr_process_admin_completions(struct spdk_nvme_ctrlr *ctrlr);
const struct spdk_nvme_ns_data *spdk_nvme_ns_get_data(struct spdk_nvme_ns *ns);
struct spdk_nvme_qpair *spdk_nvme_ctrlr_alloc_io_qpair(struct spdk_nvme_ctrlr *ctrlr,
		const struct spdk_nvme_io_qpair_opts *opts, size_t opts_size);
int spdk_nvme_ctrlr_free_io_qpair(struct spdk_nvme_qpair *qpair);
int32_t spdk_nvme_qpair_process_completions(struct spdk_nvme_qpair *qpair,
		uint32_t max_completions);
int spdk_nvme_ns_cmd_read(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair, void *payload,
			  uint64_t lba, uint32_t lba_count, spdk_nvme_cmd_cb cb_fn,
			  void *cb_arg, uint32_t io_flags);
int spdk_nvme_ns_cmd_write(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair, void *payload,
			   uint64_t lba, uint32_t lba_count, spdk_nvme_cmd_cb cb_fn,
			   void *cb_arg, uint32_t io_flags);
int spdk_nvme_ns_cmd_writev(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair,
			    uint64_t lba, uint32_t lba_count,
			    spdk_nvme_cmd_cb cb_fn, void *cb_arg, uint32_t io_flags,
			    spdk_nvme_req_reset_sgl_cb reset_sgl_fn,
			    spdk_nvme_req_next_sge_cb next_sge_fn);
int spdk_nvme_ns_cmd_flush(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair,
			   spdk_nvme_cmd_cb cb_fn, void *cb_arg);
int spdk_nvme_ns_cmd_write_zeroes(struct spdk_nvme_ns *ns, struct spdk_nvme_qpair *qpair,
				  uint64_t lba, uint32_t lba_count,
				  spdk_nvme_cmd_cb cb_fn, void *cb_arg, uint32_t io_flags);

#endif
