/* header_c99: include/channels_nats.h alone must compile as C99 with -pedantic (gcc -std=c99
   -Wall -Wextra -Werror -pedantic -c). ISO C forbids an empty translation unit, hence the typedef. */
#include "channels_nats.h"

typedef cn_status header_c99_compiled;
