/*
 * The stand-in's spdk/env.h: the part of SPDK's environment API that weir
 * uses, with the same names and signatures. The struct holds only the fields
 * weir's glue sets; its layout is the stand-in's own (the glue names fields,
 * never offsets).
 */
#ifndef WEIR_MOCK_SPDK_ENV_H
#define WEIR_MOCK_SPDK_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPDK_ENV_NUMA_ID_ANY (-1)
#define SPDK_MALLOC_DMA 0x01

struct spdk_env_opts {
	const char *name;
	const char *core_mask;
	int mem_size;
	bool no_pci;
	bool no_huge;
	size_t opts_size;
};

void spdk_env_opts_init(struct spdk_env_opts *opts);
int spdk_env_init(const struct spdk_env_opts *opts);
void *spdk_zmalloc(size_t size, size_t align, uint64_t *unused, int numa_id, uint32_t flags);
void spdk_free(void *buf);

#endif
