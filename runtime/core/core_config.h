/*
 * core_config.h — configuration (core_config.c; the JSON form in core_config_json.c):
 * versioned acceptance of a caller's struct, defaults, range checks, the
 * text form the ranks compare.
 */
#ifndef ZS_RUNTIME_CORE_CONFIG_H_
#define ZS_RUNTIME_CORE_CONFIG_H_

#include <stddef.h>
#include <stdint.h>

#include <zeroshard.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A caller's config at this library's size (versioned: zeroshard.h, the
 * rules above zs_config): *out gets its fields, and UNSET for those its
 * release lacks; *caller_version (may be NULL) its header's version.
 * Errors: INVALID_ARGUMENT naming a newer, unknown or malformed version or
 * struct_size. */
zs_status zs__config_accept(const zs_config* in, zs_config* out,
                            unsigned int* caller_version);
/* Replaces every UNSET field (and ZS_WEIGHT_DECAY_DEFAULT) by its
 * default. */
void zs__config_resolve(zs_config* c);
/* "auto", "shm", "mpi" (the JSON key's and ZS_HOST_COLLECTIVES' words):
 * 1 and *out set, or 0 for anything else (NULL included). */
int zs__host_collectives_parse(const char* word, zs_host_collectives* out);
/* accept, then resolve. */
zs_status zs__config_resolved(const zs_config* in, zs_config* out,
                              unsigned int* caller_version);
/* The range checks of zs_config_validate on a resolved config. */
zs_status zs__config_check(const zs_config* c);
/* The resolved device of a caller's config (HOST when it is malformed:
 * context creation reports that). */
zs_device_kind zs__config_device(const zs_config* config);
/* The size of zs_config in the release `version` (0: unknown). */
size_t zs__config_known_size(unsigned int version);

/* A stable text form of the fields that must agree across ranks, one
 * "config.<field>=<value>" line each, for the cross-rank check. Writes
 * at most cap bytes including NUL; returns the length it needed. */
size_t zs__config_describe(const zs_config* config, char* buf, size_t cap);
/* The caller's struct from a full one: the caller's version, struct_size
 * and the fields its release has (zs_config_init_sized's and
 * zs_config_from_json's output). Errors: zs__config_accept's. */
zs_status zs__config_give(const zs_config* full, zs_config* out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CORE_CONFIG_H_ */
