#include "support/fake_internet.h"
