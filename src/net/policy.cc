#include "net/policy.h"
