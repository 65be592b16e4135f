#include "net/sniff.h"
