#include "net/slot.h"
