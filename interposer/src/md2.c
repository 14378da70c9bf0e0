/* MD2 (RFC 1319) and HMAC-MD2 (RFC 2104, 16-byte block): the digest cudart 13 checks in the
 * INTEGRITY_CHECK export table. Small messages only (the integrity message is ~100 bytes). */
#include <stdlib.h>
#include <string.h>

#include "md2.h"

static const unsigned char S[256] = {
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19,
    98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202,
    30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18,
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122,
    169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33,
    128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3,
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198,
    79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241,
    69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15,
    85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38,
    44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82,
    106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57,
    242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10,
    49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
};

static void compress(unsigned char x[48], const unsigned char *block) {
    for (int j = 0; j < 16; j++) {
        x[16 + j] = block[j];
        x[32 + j] = (unsigned char)(x[j] ^ block[j]);
    }
    unsigned t = 0;
    for (int j = 0; j < 18; j++) {
        for (int k = 0; k < 48; k++) t = x[k] ^= S[t];
        t = (t + (unsigned)j) & 0xff;
    }
}

int crane_md2(const unsigned char *msg, size_t len, unsigned char out[16]) {
    size_t padded = len + (16 - len % 16);
    unsigned char *m = malloc(padded + 16);
    if (!m) return -1;
    memcpy(m, msg, len);
    memset(m + len, (int)(padded - len), padded - len);
    unsigned char c[16] = {0}, l = 0;
    for (size_t i = 0; i < padded; i += 16)
        for (int j = 0; j < 16; j++) l = c[j] ^= S[m[i + j] ^ l];
    memcpy(m + padded, c, 16);
    unsigned char x[48] = {0};
    for (size_t i = 0; i < padded + 16; i += 16) compress(x, m + i);
    memcpy(out, x, 16);
    free(m);
    return 0;
}

int crane_hmac_md2(const unsigned char key[16], const unsigned char *msg, size_t len,
                   unsigned char out[16]) {
    unsigned char *inner = malloc(16 + len), outer[32];
    if (!inner) return -1;
    for (int i = 0; i < 16; i++) {
        inner[i] = key[i] ^ 0x36;
        outer[i] = key[i] ^ 0x5c;
    }
    memcpy(inner + 16, msg, len);
    int rc = crane_md2(inner, 16 + len, outer + 16);
    free(inner);
    return rc ? rc : crane_md2(outer, 32, out);
}
