#ifndef CRANE_MD2_H
#define CRANE_MD2_H
#include <stddef.h>
int crane_md2(const unsigned char *msg, size_t len, unsigned char out[16]);
int crane_hmac_md2(const unsigned char key[16], const unsigned char *msg, size_t len,
                   unsigned char out[16]);
#endif
